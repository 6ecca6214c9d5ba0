"""Compile codegen entries (v4serve/codegen/registry*.py) for one arch and write what each stage made
(development tool: reading where Triton put barriers, loads or spills, without a GPU).

    python scripts/dump_kernel.py OUT_DIR 'two_pass_values_fp8kv_gluon' [--arch 90]

Writes OUT_DIR/<entry>.{ttgir,llir,ptx,sass} for every entry whose name matches the regex, and prints
each one's registers, shared memory and the PTX's barrier / cp.async / wgmma counts.
"""
import argparse
import os
import re

from v4serve.codegen import toolchain
from v4serve.codegen.parse import resource_usage
from v4serve.codegen.registry import KERNELS

COUNTED = ("bar.sync", "barrier.sync", "cp.async.wait_group", "fence.proxy.async", "wgmma.mma_async")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("pattern", help="regex over the entries' names")
    parser.add_argument("--arch", type=int, default=90)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    specs = [s for s in KERNELS if re.search(args.pattern, s.name)]
    if not specs:
        raise SystemExit(f"no codegen entry matches {args.pattern!r}")
    for spec in specs:
        compiled = toolchain.compile_spec(spec, args.arch)
        usage, sass = toolchain.cuobjdump(compiled.asm["cubin"])
        base = os.path.join(args.out_dir, spec.name)
        for stage in ("ttgir", "llir", "ptx"):
            with open(f"{base}.{stage}", "w") as f:
                f.write(compiled.asm[stage])
        with open(f"{base}.sass", "w") as f:
            f.write(sass)
        ptx = compiled.asm["ptx"]
        counts = ", ".join(f"{c} {ptx.count(c)}" for c in COUNTED)
        print(f"{spec.name}: {resource_usage(usage).get('REG')} registers, {compiled.metadata.shared} B shared; "
              f"PTX: {counts}")


if __name__ == "__main__":
    main()
