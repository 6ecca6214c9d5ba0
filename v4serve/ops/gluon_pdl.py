"""Programmatic dependent launch from Gluon kernels (sm_90+): the two griddepcontrol instructions as
Gluon device functions (Triton's `gdc_wait` / `gdc_launch_dependents` are `tl` functions)."""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


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
