"""What a registry entry says: how to compile a kernel, and what its machine code must look like.

A ``KernelSpec`` mirrors one production launch: the argument types the JIT would see, which
arguments it would mark 16-divisible (16-byte-aligned pointers, integers that are multiples of
16), the constexprs of the launch and its ``num_warps``/``num_stages``. ``Expect`` states the
properties the compiled code must keep on every arch and Triton version we support.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field

# Shared memory one block may use (the opt-in maximum), bytes.
ARCH_SHARED_LIMIT = {
    80: 163 * 1024,
    86: 99 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    120: 99 * 1024,
}
DEFAULT_ARCHS = (80, 90, 100, 120)


@dataclass(frozen=True)
class Expect:
    """Properties of the compiled kernel that ``--check`` enforces on every arch.

    kv_load_bytes: width every KV row gather must keep per load: 16 for rows whose base and
        stride are 16-byte aligned, 4 for packed rows read as int32 words. The check fails when
        the kernel has any global load narrower than 4 bytes, or no load of this width at all.
    kv_lines: optional regex over source lines; when set, every global load compiled from a
        matching line must be at least ``kv_load_bytes`` wide (and at least one must exist).
    max_regs: registers per thread: an int for every arch, or a dict naming each arch the entry
        compiles for (an arch it leaves out gets the hardware maximum, 255: no bound at all).
    tensor_cores: the kernel has a ``tl.dot``, so its SASS must contain tensor-core instructions.
    max_shared: bytes of shared memory; the arch limit always applies as well.
    max_spill_ops: STL/LDL instructions the kernel may contain (default: none). Only for a
        kernel whose entry says where its spills sit and why they are cheap.
    """
    kv_load_bytes: int | None = None
    kv_lines: str | None = None
    max_regs: int | dict[int, int] = 255
    tensor_cores: bool = False
    max_shared: int | None = None
    max_spill_ops: int = 0

    def regs_bound(self, arch: int) -> int:
        if isinstance(self.max_regs, dict):
            return self.max_regs.get(arch, 255)
        return self.max_regs


@dataclass(frozen=True)
class KernelSpec:
    """One Triton kernel at one production tile configuration.

    fn: ``"package.module:kernel_name"``; the module is imported only when compiling (a
        ``@triton.jit`` object also works, for kernels that live in tests; ``@gluon.jit``
        kernels compile the same way).
    types: Triton type of each runtime argument (``"*bf16"``, ``"i32"``, ``"fp32"``, ...).
        Every argument of the kernel must be in ``types`` or in ``constexprs``.
    aligned: arguments the JIT marks 16-divisible for the launch (``tt.divisibility = 16``).
    constexprs: compile-time arguments; an integer argument the JIT sees equal to 1 (a unit
        stride) belongs here too, because the JIT specializes it the same way.
    maxnreg: the launch's ``maxnreg`` option (registers per thread), when it sets one.
    """
    name: str
    fn: object  # str, or the kernel itself
    types: dict[str, str]
    aligned: tuple[str, ...] = ()
    constexprs: dict[str, object] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 2
    expect: Expect = Expect()
    archs: tuple[int, ...] | None = None  # None: every arch asked for
    maxnreg: int | None = None

    def load_fn(self):
        """The ``JITFunction``, unwrapping ``@triton.autotune``/``@triton.heuristics`` and the
        interpreter's wrapper (``TRITON_INTERPRET=1``, as in the CPU test suite)."""
        from triton.runtime.jit import JITFunction
        obj = self.fn
        if isinstance(obj, str):
            module, attr = obj.split(":")
            obj = getattr(importlib.import_module(module), attr)
        while not isinstance(obj, JITFunction):
            inner = getattr(obj, "fn", None)
            if inner is None:
                raise TypeError(f"{self.name}: {self.fn} is not a @triton.jit function")
            # NOTE: a kernel re-wrapped here compiles, but its @jit helpers stay interpreted.
            obj = JITFunction(inner) if inspect.isfunction(inner) else inner
        return obj

    def signature(self, arg_names: list[str]) -> dict[str, str]:
        """The full ``ASTSource`` signature, checked against the kernel's argument list."""
        missing = [a for a in arg_names if a not in self.types and a not in self.constexprs]
        unknown = [a for a in [*self.types, *self.constexprs, *self.aligned] if a not in arg_names]
        if missing or unknown:
            raise ValueError(f"{self.name}: registry entry does not match {self.fn}"
                             f" (missing: {missing}, not arguments: {unknown})")
        return {a: "constexpr" if a in self.constexprs else self.types[a] for a in arg_names}
