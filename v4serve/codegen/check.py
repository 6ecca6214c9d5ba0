"""Compare one kernel's measurements on one arch with the expectations of its registry entry."""
from __future__ import annotations

import os
import re
from collections import Counter

from .spec import ARCH_SHARED_LIMIT, Expect

WORD = 4  # bytes: anything narrower is a sub-word load, never right for a row gather


def violations(expect: Expect, arch: int, m: dict) -> list[str]:
    """Every expectation ``m`` (a ``toolchain.measure`` dict) breaks, as readable sentences."""
    out = []
    if m["local_ops"] > expect.max_spill_ops or (m["local_bytes"] and not expect.max_spill_ops):
        allowed = f"at most {expect.max_spill_ops} STL/LDL" if expect.max_spill_ops else "none"
        out.append(f"spills to local memory ({m['local_bytes']} B, "
                   f"{m['local_ops']} STL/LDL instructions); expected {allowed}")
    limit = ARCH_SHARED_LIMIT.get(arch)
    if limit is not None and m["shared"] > limit:
        out.append(f"shared memory {m['shared']} B exceeds the sm_{arch} limit of {limit} B")
    if expect.max_shared is not None and m["shared"] > expect.max_shared:
        out.append(f"shared memory {m['shared']} B exceeds the stated {expect.max_shared} B")
    bound = expect.regs_bound(arch)
    if m["regs"] is None or m["regs"] > bound:
        out.append(f"{m['regs']} registers per thread; the stated bound is {bound}")
    if expect.tensor_cores and not m["tensor_cores"]:
        out.append("no tensor-core instructions (HMMA/HGMMA/UTC*MMA) in SASS for a kernel with tl.dot")
    if expect.kv_load_bytes:
        out += _load_violations(expect, m["load_sites"])
    return out


def _load_violations(expect: Expect, sites: list) -> list[str]:
    want = expect.kv_load_bytes
    out = []
    narrow = [s for s in sites if s[1] < min(want, WORD)]
    if narrow:
        out.append(f"KV gather must use {want}-byte loads; found {_describe(narrow)}")
    if not any(s[1] >= want for s in sites):
        out.append(f"KV gather must use {want}-byte loads; the kernel has none "
                   f"(global loads: {_widths(sites)})")
    if expect.kv_lines:
        pattern = re.compile(expect.kv_lines)
        on_kv = [s for s in sites if pattern.search(s[4])]
        if not on_kv:
            out.append(f"no global load compiled from a source line matching kv_lines={expect.kv_lines!r}")
        short = [s for s in on_kv if s[1] < want]
        if short:
            out.append(f"KV gather lines must use {want}-byte loads; found {_describe(short)}")
    return out


def _describe(sites: list) -> str:
    """``"128 x 2-byte ld.global at sparse_attn.py:57"`` for the most frequent offenders."""
    where = Counter((kind, nbytes, os.path.basename(f), line) for kind, nbytes, f, line, _ in sites)
    parts = [f"{n} x {nbytes}-byte {'ld.global' if kind == 'ld' else kind}"
             + (f" at {f}:{line}" if line else "")
             for (kind, nbytes, f, line), n in where.most_common(3)]
    more = len(where) - 3
    return ", ".join(parts) + (f" and {more} more sites" if more > 0 else "")


def _widths(sites: list) -> str:
    hist = Counter(s[1] for s in sites)
    return ", ".join(f"{n} x {b} B" for b, n in sorted(hist.items())) or "none"
