"""Sweep of DeepSeek-V4.1's decode attention routes over its two packed formats (development tool:
`python -m v4serve.bench.kernel_configs 'two-format'`): at B decode tokens of V4.1-Flash's shape
(bench/v41_attn_case.py), production (each token's columns unpacked, then the bf16 decode kernels)
against the compaction route (every referenced row unpacked once, bounded by the shapes) and the
bf16 launch over pools unpacked beforehand (the lower bound of any unpack-first route). One line a
candidate: median µs and the relative error against production."""

from v4serve.bench.shapes import sparse_decode_case
from v4serve.bench.v41_attn_case import COMPRESSED_FORMAT, WINDOW_FORMAT
from v4serve.ops.kv_pack import pack_rows, unpack_rows
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton, sparse_attn_two_formats_triton

SHAPES = {f"two-format decode B{b}": (4, b, 32767) for b in (1, 8, 32)}
CANDIDATES = [None, "compact", "bf16 rows", None]


def _run(case):
    q, win, cmp, idx, n_window, sink, scale, counts = case.args()
    pw, pc = pack_rows(win, WINDOW_FORMAT), pack_rows(cmp, COMPRESSED_FORMAT)
    uw, uc = unpack_rows(pw, WINDOW_FORMAT, q.shape[-1]), unpack_rows(pc, COMPRESSED_FORMAT, q.shape[-1])

    def run(cfg):
        if cfg == "bf16 rows":
            return sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, scale, counts)
        return sparse_attn_two_formats_triton(q, pw, pc, idx, n_window, sink, scale, counts, WINDOW_FORMAT,
                                              COMPRESSED_FORMAT, route=cfg)

    return run


def sweep(only: str) -> None:
    from v4serve.bench.kernel_configs import _sweep

    for name, args in SHAPES.items():
        if only in name:
            _sweep(name, _run(sparse_decode_case(*args, "cuda")), CANDIDATES)
