"""Where a kernel's warps stall, from an Nsight Compute source-page CSV (development tool).

Produce the CSV on the GPU machine, e.g. for the warp-specialised sparse attention:

    ncu --clock-control none --section SourceCounters --section WarpStateStats \
        -k regex:_sparse_attn_ws_kernel --launch-skip 2 --launch-count 1 \
        --page source --print-source sass --csv python3 <script running the shape 3 times> > ncu.csv

then `python scripts/ncu_stalls.py ncu.csv`. The SASS is split into regions at each
`USETMAXREG` (a warp-specialised kernel's partitions each start with one; other kernels are one
region; each further profiled launch's table, --launch-count > 1, starts its own), and per region
it prints the share of all stall samples, the top stall reasons and the opcodes and instructions
that hold them.
"""
import collections
import csv
import re
import sys


def main(path: str, top: int = 8) -> None:
    rows = list(csv.reader(open(path)))
    head = next(i for i, r in enumerate(rows) if "Source" in r and "Address" in r)
    col = {name: i for i, name in enumerate(rows[head])}
    reasons = [name for name in rows[head] if name.startswith("stall_") and "Not Issued" not in name]
    samples_col = col["Warp Stall Sampling (All Samples)"]
    launch, region, total = 0, "prologue", 0.0
    samples, by_reason, by_opcode, lines = (collections.Counter(), collections.defaultdict(collections.Counter),
                                            collections.defaultdict(collections.Counter), collections.defaultdict(list))
    for r in rows[head + 1:]:
        if "Source" in r and "Address" in r:  # the next profiled launch's table (--launch-count > 1)
            launch, region = launch + 1, f"launch {launch + 1}: prologue"
            continue
        if len(r) < len(col):  # a blank or report line between tables
            continue
        sass = r[col["Source"]].strip()
        marker = re.search(r"USETMAXREG\.(\w+)\.CTAPOOL (?:UP0, )?(0x[0-9a-f]+)", sass)
        if marker:
            region = f"{marker.group(1).lower()} {int(marker.group(2), 16)} regs"
            region = f"launch {launch}: {region}" if launch else region
        n = float(r[samples_col] or 0)
        total += n
        samples[region] += n
        opcode = sass.split()[1] if sass.startswith("@") else (sass.split() or ["?"])[0]
        by_opcode[region][opcode.split(".")[0]] += n
        lines[region].append((n, sass[:80]))
        for name in reasons:
            by_reason[region][name[len("stall_"):]] += float(r[col[name]] or 0)
    pct = lambda v: f"{100 * v / total:.1f}%"  # noqa: E731
    for region, n in samples.items():
        if n < 0.01 * total:
            continue
        print(f"== {region}: {pct(n)} of samples")
        print("   reasons:", ", ".join(f"{k} {pct(v)}" for k, v in by_reason[region].most_common(6) if v))
        print("   opcodes:", ", ".join(f"{k} {pct(v)}" for k, v in by_opcode[region].most_common(top)))
        for v, sass in sorted(lines[region], reverse=True)[:top]:
            print(f"   {pct(v):>6} {sass}")


if __name__ == "__main__":
    main(sys.argv[1])
