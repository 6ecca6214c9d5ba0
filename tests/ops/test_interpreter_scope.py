"""The interpreter must leave `triton.language` as it found it (tests/triton_interpreter_scope.py).

Without the scope fix, a kernel calling one of Triton's own @jit helpers (`tl.max` lives in
`triton/language/standard.py`) leaves `triton.language.core`'s builtins replaced by interpreter
lambdas, and a later real compile in the same process fails (the cold-cache codegen flake).
"""

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CPU interpreter")


@triton.jit
def _row_max_kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr, tl.max(tl.load(x_ptr + i) * 2.0, axis=0))  # tl.max: a @jit helper of standard.py


def _builtins(module) -> dict:
    return {name: value for name, value in vars(module).items() if tl.core.is_builtin(value)}


def test_device_helper_calls_leave_triton_language_unpatched():
    # This module must not hold `triton.language.core` as a global: the interpreter patches (and
    # restores) the language modules in the kernel's globals, which would hide the leak.
    core = tl.core
    before_core, before_tl = _builtins(core), _builtins(tl)
    x = torch.randn(64)
    out = torch.empty(1)
    _row_max_kernel[(1,)](x, out, N=64)
    assert out.item() == (x * 2).max().item()  # the kernel ran and used the helper
    assert _builtins(core) == before_core
    assert _builtins(tl) == before_tl
    assert len(before_core) > 50  # the comparison covers the language's builtins (mul, arange, ...)
