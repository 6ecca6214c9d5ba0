"""``v4serve kernels report``: compile every registered kernel for each arch and report its code.

    python -m v4serve.codegen [--arch 80,90,100,120] [--json PATH] [--check] [-k REGEX]

Prints a progress line per (kernel, arch) on stderr as each compile ends, then one table row
per (kernel, arch), then, with ``--check``, one line per broken
expectation, then one JSON record as the last line of stdout. Exit status 1 when ``--check``
finds a violation, a kernel fails to compile for an arch this Triton supports, or this Triton
cannot compile for one of the default archs at all.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable

import triton

from . import check, toolchain
from .registry import KERNELS
from .spec import DEFAULT_ARCHS, KernelSpec

_UNSUPPORTED: dict[int, str | None] = {}


def _arch_reason(arch: int) -> str | None:
    if arch not in _UNSUPPORTED:
        _UNSUPPORTED[arch] = toolchain.arch_unsupported(arch)
    return _UNSUPPORTED[arch]


def run_one(spec: KernelSpec, arch: int) -> dict:
    """Measure one (kernel, arch): status ``ok``, ``error`` (kernel fails) or ``unsupported``."""
    row = {"kernel": spec.name, "arch": arch}
    if (reason := _arch_reason(arch)) is not None:
        return {**row, "status": "unsupported", "error": reason}
    try:
        return {**row, "status": "ok", **toolchain.measure(spec, arch)}
    except Exception as e:  # noqa: BLE001 - one kernel failing must not hide the others
        return {**row, "status": "error", "error": toolchain.first_line(e)}


def collect(specs: list[KernelSpec], archs: list[int], jobs: int,
            progress: Callable[[dict, int, int], None] | None = None) -> list[dict]:
    """Run every (kernel, arch) pair, in parallel worker processes when ``jobs > 1``; rows come
    back in (kernel, arch) order, and ``progress(row, done, total)`` hears of each as it ends."""
    pairs = [(s, a) for s in specs for a in archs if s.archs is None or a in s.archs]
    report = progress or (lambda row, done, total: None)
    if jobs <= 1:
        rows = []
        for s, a in pairs:
            rows.append(run_one(s, a))
            report(rows[-1], len(rows), len(pairs))
        return rows
    # NOTE: fork before this process compiles anything; each worker owns its MLIR contexts.
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        futures = {pool.submit(_run_one, s, a): i for i, (s, a) in enumerate(pairs)}
        rows: list[dict | None] = [None] * len(pairs)
        for done, future in enumerate(as_completed(futures), start=1):
            rows[futures[future]] = future.result()
            report(rows[futures[future]], done, len(pairs))
        return rows


def _run_one(spec: KernelSpec, arch: int) -> dict:
    return run_one(spec, arch)  # looked up in the worker: what the parent process had at fork


def print_progress(start: float) -> Callable[[dict, int, int], None]:
    """One line per finished (kernel, arch) on stderr, flushed (a full report takes minutes)."""
    version = triton.__version__

    def show(row: dict, done: int, total: int) -> None:
        print(f"[{done}/{total} {time.perf_counter() - start:6.1f}s] {row['kernel']} sm_{row['arch']} "
              f"triton {version}: {row['status']}", file=sys.stderr, flush=True)

    return show


def add_violations(rows: list[dict], specs: dict[str, KernelSpec]) -> None:
    """Each row's broken expectations. An arch this Triton cannot build is one only when it is a
    default arch: CI checks those under every Triton version, and must not lose one silently."""
    for row in rows:
        if row["status"] == "ok":
            row["violations"] = check.violations(specs[row["kernel"]].expect, row["arch"], row)
        elif row["status"] == "error":
            row["violations"] = [f"does not compile: {row['error']}"]
        elif row["arch"] in DEFAULT_ARCHS:
            row["violations"] = [f"arch unsupported by this Triton, but sm_{row['arch']} is a default arch "
                                 f"({row['error']})"]
        else:
            row["violations"] = []


_COLUMNS = ("kernel", "sm", "regs", "spill", "smem", "ld1", "ld2", "ld4", "ld8", "ld16",
            "cp.async", "tensor core", "sass", "check")


def _cells(row: dict) -> list[str]:
    head = [row["kernel"], str(row["arch"])]
    if row["status"] != "ok":
        note = "arch unsupported" if row["status"] == "unsupported" else "compile error"
        return head + ["-"] * (len(_COLUMNS) - 3) + [note]
    loads = row["loads"]
    cp = " ".join(f"{n}x{k[2:]}B" for k, n in loads.items() if k.startswith("cp")) or "0"
    tc = " ".join(f"{op} {n}" for op, n in sorted(row["tensor_cores"].items())) or "-"
    spill = row["local_bytes"] or row["local_ops"]
    return head + [str(row["regs"]), str(spill), str(row["shared"])] \
        + [str(loads.get(f"ld{w}", 0)) for w in (1, 2, 4, 8, 16)] \
        + [cp, tc, str(row["sass_insts"]), "FAIL" if row["violations"] else "ok"]


def format_table(rows: list[dict]) -> str:
    """A plain-text table (also valid Markdown) with one line per (kernel, arch)."""
    table = [list(_COLUMNS)] + [_cells(r) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in table]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _parse_args(argv):
    p = argparse.ArgumentParser(prog="v4serve kernels report", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--arch", default=",".join(map(str, DEFAULT_ARCHS)),
                   help="comma-separated SM versions")
    p.add_argument("--json", metavar="PATH", help="also write the JSON record to PATH")
    p.add_argument("--check", action="store_true", help="exit 1 if an expectation is broken")
    p.add_argument("-k", "--kernel", default="", help="only kernels whose name matches REGEX")
    p.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines (on stderr) while compiling")
    return p.parse_args(argv)


def main(argv=None, kernels: tuple[KernelSpec, ...] = KERNELS) -> int:
    """CLI entry point; ``kernels`` replaces the registry (tests pass kernels of their own)."""
    args = _parse_args(argv)
    # The interpreter would hand us wrappers instead of JIT functions; 3.9 warns without this.
    os.environ.pop("TRITON_INTERPRET", None)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    start = time.perf_counter()
    archs = [int(a.strip().removeprefix("sm_")) for a in args.arch.split(",") if a.strip()]
    specs = {s.name: s for s in kernels if re.search(args.kernel, s.name)}
    rows = collect(list(specs.values()), archs, args.jobs, None if args.quiet else print_progress(start))
    add_violations(rows, specs)
    version = triton.__version__
    print(f"triton {version}: " + ", ".join(f"sm_{a} {toolchain.ptxas_version(a)}" for a in archs))
    print(format_table(rows))
    for r in rows:
        fails = r["violations"] if args.check else []
        if r["status"] == "unsupported" and not fails:
            print(f"NOTE {r['kernel']} sm_{r['arch']} triton {version}: arch unsupported ({r['error']})")
        for v in fails:
            print(f"FAIL {r['kernel']} sm_{r['arch']} triton {version}: {v}")
    record = _record(rows, archs, time.perf_counter() - start)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    print(json.dumps(record, separators=(",", ":")))
    return 1 if args.check and record["violations"] else 0


def _record(rows: list[dict], archs: list[int], seconds: float) -> dict:
    kept = [{k: v for k, v in r.items() if k != "load_sites"} for r in rows]
    return {
        "triton": triton.__version__,
        "ptxas": {str(a): toolchain.ptxas_version(a) for a in archs},
        "kernels": kept,
        "violations": sum(len(r["violations"]) for r in rows),
        "seconds": round(seconds, 2),
    }


if __name__ == "__main__":
    sys.exit(main())
