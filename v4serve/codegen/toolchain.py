"""Compile a registered kernel ahead of time, without a GPU, and measure what came out.

``triton.compile(ASTSource(...), target=GPUTarget("cuda", arch, 32))`` runs the whole pipeline
(TTIR, TTGIR, LLVM IR, PTX, then ptxas to a cubin) with no driver; the API is the same in every
Triton from 3.3 on. Registers and SASS come from the ``cuobjdump`` that Triton bundles in
``triton/backends/nvidia/bin`` (``CompiledKernel.n_regs`` needs a driver; the system CUDA may
have no cuobjdump, or a ptxas too old for the PTX that newer Tritons emit).
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import io
import linecache
import os
import re
import subprocess
import tempfile
from pathlib import Path

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import parse
from .spec import KernelSpec


def tool(name: str) -> str:
    """Path of a bundled NVIDIA tool (``cuobjdump``, ``ptxas``, ``ptxas-blackwell``)."""
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"triton {triton.__version__} does not bundle {name} ({path})")
    return str(path)


@functools.lru_cache
def ptxas_version(arch: int) -> str:
    """``"ptxas-blackwell 12.9"``: the assembler this Triton uses for ``arch``, and its release."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas
        path = get_ptxas(arch).path
    except Exception as e:  # noqa: BLE001 - report, never crash on a private API change
        return f"unknown ({type(e).__name__})"
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release (\d+\.\d+)", out)
    return f"{Path(path).name} {release.group(1) if release else '?'}"


def compile_spec(spec: KernelSpec, arch: int):
    """``triton.compile`` the entry for ``arch`` with the attributes the JIT would give it."""
    fn = spec.load_fn()
    attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in spec.aligned}
    src = _source_class(fn)(fn=fn, signature=spec.signature(fn.arg_names), constexprs=spec.constexprs,
                            attrs=attrs)
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages}
    if spec.maxnreg is not None:
        options["maxnreg"] = spec.maxnreg
    # NOTE: on a ptxas failure Triton prints the whole PTX to stdout; the exception says enough.
    with contextlib.redirect_stdout(io.StringIO()):
        return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def _source_class(fn):
    """``ASTSource`` for ``@triton.jit`` kernels, ``GluonASTSource`` for ``@gluon.jit`` ones."""
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource
        return GluonASTSource
    return ASTSource


def cuobjdump(cubin: bytes) -> tuple[str, str]:
    """(resource usage, SASS) of a cubin, from the bundled cuobjdump."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        res = _run([tool("cuobjdump"), "--dump-resource-usage", path])
        sass = _run([tool("cuobjdump"), "--dump-sass", path])
    return res, sass


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(cmd[0]).name} failed: {proc.stderr.strip()[:300]}")
    return proc.stdout


def measure(spec: KernelSpec, arch: int) -> dict:
    """Compile and measure one kernel for one arch; a plain dict (it crosses processes)."""
    ck = compile_spec(spec, arch)
    fn_file = inspect.getsourcefile(spec.load_fn().fn)
    ptx = ck.asm["ptx"]
    res, sass = cuobjdump(ck.asm["cubin"])
    usage = parse.resource_usage(res)
    ops = parse.sass_opcodes(sass)
    loads = parse.ptx_loads(ptx)
    return {
        "regs": usage.get("REG"),
        "local_bytes": usage.get("LOCAL", 0) + usage.get("STACK", 0),
        "local_ops": parse.sass_local_memory_ops(ops),
        "shared": ck.metadata.shared,
        "loads": parse.load_histogram(loads),
        "load_sites": [(ld.kind, ld.nbytes, ld.file, ld.line, _source_line(fn_file, ld))
                       for ld in loads],
        "tma": parse.ptx_uses_tma(ptx),
        "tensor_cores": parse.sass_tensor_core_ops(ops),
        "ptx_mma": parse.ptx_tensor_core_ops(ptx),
        "sass_insts": parse.sass_instruction_count(ops),
    }


def _source_line(fn_file: str, ld: parse.Load) -> str:
    """Text of the load's source line. NOTE: a cached compile keeps the path it was first built
    from (another checkout), so a path with the kernel file's name reads the kernel file."""
    path = fn_file if os.path.basename(ld.file) == os.path.basename(fn_file) else ld.file
    return linecache.getline(path, ld.line).strip() if ld.line else ""


@triton.jit
def _probe_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs) + 1.0)


_PROBE = KernelSpec("probe", f"{__name__}:_probe_kernel", {"x_ptr": "*fp32", "y_ptr": "*fp32"},
                    aligned=("x_ptr", "y_ptr"), constexprs={"BLOCK": 128})


def arch_unsupported(arch: int) -> str | None:
    """Why this Triton cannot build code for ``arch`` at all, or None when it can."""
    try:
        ck = compile_spec(_PROBE, arch)
        cuobjdump(ck.asm["cubin"])
    except Exception as e:  # noqa: BLE001 - any toolchain failure makes the arch unsupported
        return first_line(e)
    return None


def first_line(e: BaseException) -> str:
    """The informative line of a compiler error (ptxas's ``fatal`` line when there is one)."""
    lines = [s.strip() for s in str(e).splitlines() if s.strip().strip("=")]
    fatal = [s for s in lines if re.search(r"fatal|error\b", s, re.I) and "Internal Triton" not in s]
    line = (fatal or lines or [""])[0]
    return f"{type(e).__name__}: {line[:200]}"
