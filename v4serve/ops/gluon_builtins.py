"""The Gluon builtins v4serve's Gluon kernels share, under one name across Triton 3.6-3.9: cp.async's
copy (3.8 renamed it `async_load`, 3.9 removed the old name), the partition barrier (`barrier` from
3.8), and programmatic dependent launch's two griddepcontrol instructions as Gluon device functions
(Triton's `gdc_wait` / `gdc_launch_dependents` are `tl` functions)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

cp_async = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
barrier = getattr(gl, "barrier", None) or gl.thread_barrier


@gluon.jit
def gdc_wait():
    """griddepcontrol.wait: the grid launched before this one (programmatic dependent launch) has
    finished and its writes are visible."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def gdc_launch_dependents():
    """griddepcontrol.launch_dependents: the grid launched after this one may start once every
    program of this one has passed here (its own wait still waits for this whole grid)."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)
