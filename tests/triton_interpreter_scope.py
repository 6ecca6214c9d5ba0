"""Keep Triton's CPU interpreter from leaving `triton.language.core` patched after a kernel runs.

Triton 3.6's interpreter swaps the language's builtins for interpreted ones while it runs a kernel
and restores them when the grid finishes, but a @triton.jit *device function* called from the
kernel patches the modules in its own globals with no restore (`InterpretedFunction.__call__`).
Triton's own helpers (`tl.max`, `tl.sum`, `tl.cdiv`, ... in `triton/language/standard.py`) hold
`triton.language.core` in their globals, so after the first interpreted kernel that calls one,
`core.mul`, `core.arange`, ... stay interpreter lambdas for the rest of the process. A later real
compile in the same process (the codegen tests) then fails inside `tensor.__mul__` with
"'ir.value' object has no attribute 'dtype'" — unless a warm Triton cache skips the compile,
which is why the failure showed only on fresh machines.

`apply()` wraps the device-function call so that its patches are undone when it returns.
"""

import triton
from triton.runtime import interpreter as interp

TESTED_TRITON = "3.6.0"


def _scoped_device_call(self, *args, **kwargs):
    scope = interp._patch_lang(self.fn)
    try:
        return self.rewrite()(*args, **kwargs)
    except Exception as e:
        raise interp.InterpreterError(repr(e)) from e
    finally:
        scope.restore()


def apply() -> None:
    """Patch the interpreter in place (idempotent). Refuses any triton other than the tested one."""
    if triton.__version__ != TESTED_TRITON:
        raise RuntimeError(f"triton_interpreter_scope is tested with triton {TESTED_TRITON}, found {triton.__version__}")
    interp.InterpretedFunction.__call__ = _scoped_device_call
