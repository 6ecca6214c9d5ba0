"""DeepSeek-V4.1 attention and Engram benchmark cases: the rows the V4.1 model's decode and prefill
steps run, at V4.1-Flash's shapes, built from the V4 sparse-attention cases (bench/shapes.py: 64
heads of 512, a 128-row window, top-512 compressed picks) with the pools packed in V4.1's formats.

* `sparse decode v41 B{B} pos32767` / `sparse prefill v41 S{S}[@start]`: window rows fp8_e8m0_b32
  (528 B), compressed rows fp4_e4m3_b16 (288 B), each pool its own row stride; the op is the
  production route (`sparse_attn_paged` with both formats: the referenced rows unpacked to bf16,
  then the bf16 kernels). Floor: q and the column table read, each referenced row's packed bytes
  read once, the output written (the unpacked rows' round trip is the route's own cost).
* `engram lookup flash c{c}`: one V4.1-Flash Engram table lookup for c decode tokens (24 rows of
  256 e4m3 codes + 8 scale bytes per token) from a pinned host table of 2^20 rows, read in place
  by the kernel (ops/engram_lookup.py). Floor: the gathered bytes over the host link.
"""

import torch

from v4serve.bench.shapes import HEAD_DIM, sparse_decode_case, sparse_prefill_case
from v4serve.formats import row_format
from v4serve.ops.engram_lookup import engram_lookup
from v4serve.ops.kv_pack import pack_rows
from v4serve.ops.sparse_attn import sparse_attn_paged
from v4serve.ops.sparse_attn_reference import live_columns

WINDOW_FORMAT, COMPRESSED_FORMAT = row_format("fp8_e8m0_b32"), row_format("fp4_e4m3_b16")
ENGRAM_ROWS_PER_TOKEN, ENGRAM_HEAD_DIM, ENGRAM_TABLE_ROWS = 24, 256, 1 << 20


def v41_attn_shapes() -> dict:
    shapes = {f"sparse decode v41 B{b} pos32767": ("decode_v41kv", (4, b, 32767)) for b in (1, 8, 64)}
    shapes["sparse prefill v41 S2048"] = ("prefill_v41kv", (4, 2048, 0))
    shapes["sparse prefill v41 S4096@28672"] = ("prefill_v41kv", (4, 4096, 28672))
    for c in (1, 8, 64):
        shapes[f"engram lookup flash c{c}"] = ("engram_lookup", (c,))
    return shapes


def build_v41_attn(kind: str, args: tuple, device, seed: int = 0):
    """-> (fn, bytes, flops, bytes of one input set) of a `sparse ... v41` row."""
    case = (sparse_prefill_case if kind == "prefill_v41kv" else sparse_decode_case)(*args, device=device, seed=seed)
    q, win, cmp, idx, n_window, sink, scale, counts = case.args()
    pw, pc = pack_rows(win, WINDOW_FORMAT), pack_rows(cmp, COMPRESSED_FORMAT)
    live = live_columns(idx, n_window, counts)
    window_rows = int(torch.unique(idx[..., :n_window][live[..., :n_window]]).numel())
    compressed_rows = int(torch.unique(idx[..., n_window:][live[..., n_window:]]).numel())
    nbytes = (2 * q.numel() * q.element_size() + idx.numel() * 4 + window_rows * pw.shape[1]
              + compressed_rows * pc.shape[1])
    flops = 4 * q.shape[2] * HEAD_DIM * int(live.sum())
    bound = win.shape[0] + cmp.shape[0] if q.shape[1] > 1 else None  # the step plan's bound: every row it can see
    fn = lambda: sparse_attn_paged(q, pw, pc, idx, n_window, sink, scale, counts,  # noqa: E731
                                   row_format=WINDOW_FORMAT.name, cmp_row_format=COMPRESSED_FORMAT.name,
                                   unpack_bound=bound)
    return fn, nbytes, flops, nbytes


def build_engram_lookup(tokens: int, device, seed: int = 0):
    """-> (fn, bytes, 0, bytes, None: the bytes cross the host link)."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 0x7E, (ENGRAM_TABLE_ROWS, ENGRAM_HEAD_DIM), generator=g, dtype=torch.uint8)
    table = codes.view(torch.float8_e4m3fn).pin_memory()
    scales = torch.randint(119, 122, (ENGRAM_TABLE_ROWS, ENGRAM_HEAD_DIM // 32), generator=g,
                           dtype=torch.uint8).pin_memory()
    rows = torch.randint(0, ENGRAM_TABLE_ROWS, (tokens, ENGRAM_ROWS_PER_TOKEN), generator=g).to(device)
    nbytes = rows.numel() * (ENGRAM_HEAD_DIM + ENGRAM_HEAD_DIM // 32)
    return (lambda: engram_lookup(table, scales, rows, torch.bfloat16)), nbytes, 0, nbytes, None
