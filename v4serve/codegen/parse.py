"""Read what ptxas and Triton produced: global loads in PTX, opcodes in SASS, resource usage.

Every function here takes text and returns plain data, so the parsing is unit-tested on small
fixed strings (tests/test_codegen_parse.py) without compiling anything.

PTX global loads are counted statically (instructions in the listing, not executions) and sized
in bytes per thread: ``ld.global.v4.b32`` is 16 bytes, ``ld.global.b16`` is 2. ``cp.async``
copies (Ampere-style asynchronous global->shared loads) are counted separately by their size
operand. Each load is attributed to the source line of the ``.loc`` directive before it, so a
check can name the line of Python that lost its vector width.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:\s*,?\s*"([^"]+)")?')
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+(\d+)")
# ld.global[.qualifiers][.vN].type ; qualifiers include nc, L1::evict_last, L2::64B, ...
_LD_GLOBAL = re.compile(r"\bld\.global((?:\.[\w:]+)*)\s")
_CP_ASYNC = re.compile(r"\bcp\.async\.(?:ca|cg)\.shared(?:::\w+)?\.global(?:\.[\w:]+)*\s+"
                       r"\[[^\]]*\],\s*\[[^\]]*\],\s*(0x[0-9a-fA-F]+|\d+)")
_CP_BULK = re.compile(r"\bcp\.async\.bulk\.tensor\b")
_VEC = re.compile(r"^v(\d+)$")
_TYPE = re.compile(r"^[bsuf](\d+)$")

# SASS opcodes that run on tensor cores, by family (sm_80/sm_120 HMMA, sm_90 HGMMA,
# sm_100 UTC*MMA issued by tcgen05; QMMA/OMMA/IMMA are the fp8/fp4/int variants).
TENSOR_CORE_OPCODES = ("HMMA", "HGMMA", "QMMA", "QGMMA", "IMMA", "IGMMA", "OMMA", "UTCHMMA",
                       "UTCQMMA", "UTCIMMA", "UTCOMMA", "UTCMMA")
_TC_PTX = re.compile(r"\b(wgmma\.mma_async|mma\.sync|tcgen05\.mma)\b")
_SASS_INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[\w.]+)?)")
_RES_USAGE = re.compile(r"\b(REG|STACK|SHARED|LOCAL):(\d+)")


@dataclass(frozen=True)
class Load:
    """One static global load in the PTX listing."""
    kind: str  # "ld" (ld.global) or "cp.async"
    nbytes: int  # bytes per thread per instruction
    file: str  # source file of the preceding .loc, "" if none
    line: int  # source line of the preceding .loc, 0 if none


def ptx_loads(ptx: str) -> list[Load]:
    """Every ``ld.global`` and ``cp.async`` in ``ptx``, with width and source line."""
    files = ptx_files(ptx)
    cur_file, cur_line = "", 0
    in_asm = seen_asm_loc = False
    loads = []
    for text in ptx.splitlines():
        if "// begin inline asm" in text or "// end inline asm" in text:
            in_asm, seen_asm_loc = "begin" in text, False
            continue
        if m := _LOC.match(text):
            # NOTE: newer LLVMs put a .loc before each line of an inline-asm block and add the
            # line's offset within the block to the source line; the block's first .loc is right.
            if not (in_asm and seen_asm_loc):
                cur_file, cur_line = files.get(m.group(1), ""), int(m.group(2))
            seen_asm_loc = in_asm
            continue
        code = text.split("//", 1)[0]
        if m := _LD_GLOBAL.search(code):
            loads.append(Load("ld", _ld_width(m.group(1)), cur_file, cur_line))
        elif m := _CP_ASYNC.search(code):
            loads.append(Load("cp.async", int(m.group(1), 0), cur_file, cur_line))
    return loads


def ptx_files(ptx: str) -> dict[str, str]:
    """``.file`` table (LLVM emits it after the code): id -> path (``"dir" "name"`` joined)."""
    files = {}
    for text in ptx.splitlines():
        if m := _FILE.match(text):
            files[m.group(1)] = f"{m.group(2)}/{m.group(3)}" if m.group(3) else m.group(2)
    return files


def _ld_width(qualifiers: str) -> int:
    vec, bits = 1, 0
    for q in qualifiers.split(".")[1:]:
        if m := _VEC.match(q):
            vec = int(m.group(1))
        elif m := _TYPE.match(q):
            bits = int(m.group(1))
    return vec * bits // 8


def load_histogram(loads: list[Load]) -> dict[str, int]:
    """``{"ld2": n, "ld4": n, ..., "cp16": n}``: static load count by kind and byte width."""
    hist = Counter(f"{'ld' if ld.kind == 'ld' else 'cp'}{ld.nbytes}" for ld in loads)
    return dict(sorted(hist.items(), key=lambda kv: (kv[0][:2], int(kv[0][2:]))))


def ptx_tensor_core_ops(ptx: str) -> dict[str, int]:
    """Count of ``wgmma.mma_async`` / ``mma.sync`` / ``tcgen05.mma`` in the PTX."""
    return dict(Counter(m.group(1) for m in _TC_PTX.finditer(ptx)))


def ptx_uses_tma(ptx: str) -> bool:
    return _CP_BULK.search(ptx) is not None


def sass_opcodes(sass: str) -> Counter:
    """Histogram of full opcodes (``LDG.E.128``, ``HGMMA.64x64x16.F32.BF16``) in a SASS dump."""
    ops = Counter()
    for text in sass.splitlines():
        if m := _SASS_INSN.match(text):
            ops[m.group(1)] += 1
    return ops


def sass_instruction_count(ops: Counter) -> int:
    """Instructions in the kernel, without the NOP padding after the final branch."""
    return sum(n for op, n in ops.items() if op.split(".")[0] != "NOP")


def sass_tensor_core_ops(ops: Counter) -> dict[str, int]:
    """Tensor-core instructions by base opcode, e.g. ``{"HGMMA": 12}``."""
    tc = Counter()
    for op, n in ops.items():
        if op.split(".")[0] in TENSOR_CORE_OPCODES:
            tc[op.split(".")[0]] += n
    return dict(tc)


def sass_local_memory_ops(ops: Counter) -> int:
    """Local-memory stores and loads (STL/LDL): register spills, or a stack array."""
    return sum(n for op, n in ops.items() if op.split(".")[0] in ("STL", "LDL"))


def resource_usage(text: str) -> dict[str, int]:
    """``cuobjdump --dump-resource-usage`` of a one-kernel cubin: ``{"REG": 90, "LOCAL": 0, ...}``.

    NOTE: cuobjdump's SHARED is static shared memory only; Triton allocates dynamically, so the
    real figure is ``metadata.shared`` from the compiler.
    """
    usage: dict[str, int] = {}
    for line in text.splitlines():
        if line.strip().startswith("REG:"):
            usage.update((k, int(v)) for k, v in _RES_USAGE.findall(line))
    return usage
