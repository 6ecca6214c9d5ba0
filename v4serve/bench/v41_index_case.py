"""The DeepSeek-V4.1 indexer's benchmark cases (the FreeToken PR's 13 shapes), built as the cache
and the model hand them to `v41_index_scores`.

V4.1-Flash indexer: 32 index heads x 128, keys `fp4_e8m0_b32` (68 B rows, read as 17 int32 words)
in a paged pool: 128-token pages hold 128 / r consecutive rows of a sequence, pages placed at
random in the pool. q is fp4-rounded bf16, w bf16 with the model's scale.

* `full prefill n{n} start{s} r{r}`: one sequence, n query tokens at positions s .. s+n-1, each
  seeing (p + 1) // r of the (s + n) // r rows (Full layers: r2 encoder sources, r1 = layer 20).
* `full decode B{B} ctx{c} r{r} staged1M`: B sequences at position c - 1 (c // r rows each) in a
  pool of 2^20 rows ("staged1M": we read it as the decode staging pool sized for 1M rows).
* `cand prefill n{n} start{s} NC16384` / `cand decode B{B} ctx{c} NC16384` (Reindex layers, r1):
  each query scores its 2048 candidate blocks of 8 (16,384 slots), chosen by `candidate_blocks`
  from random candidate-source scores (newest block pinned; all blocks while there are <= 2048).
"""

from dataclasses import dataclass

import torch

from v4serve.ops.kv_pack import pack_rows
from v4serve.ops.kv_quant import apply_kv_format
from v4serve.ops.v41_index import candidate_blocks, v41_index_scores

V41_INDEX_HEADS, V41_INDEX_DIM, PAGE = 32, 128, 128
CAND_BLOCK, CAND_BLOCKS = 8, 2048
STAGED_ROWS = 1 << 20
ROW_FORMAT = "fp4_e8m0_b32"


@dataclass
class V41IndexCase:
    q: torch.Tensor  # [B, S, H, D] bf16
    w: torch.Tensor  # [B, S, H] bf16
    pool: torch.Tensor  # uint8 [N, 68]
    key_rows: torch.Tensor  # [B, R] int32
    n_visible: torch.Tensor  # [B, S] int32
    cand_blocks: torch.Tensor | None  # [B, S, 2048] int32

    def run(self, **kw) -> torch.Tensor:
        return v41_index_scores(self.q, self.w, self.pool, self.key_rows, self.n_visible, row_format=ROW_FORMAT,
                                cand_blocks=self.cand_blocks, cand_block=CAND_BLOCK, **kw)


def _paged_rows(B: int, R: int, ratio: int, pool_rows: int, g, device) -> torch.Tensor:
    """[B, R] int32: row t of sequence b at page_table[b][t // per_page] * per_page + t % per_page."""
    per_page = PAGE // ratio
    pages = -(-R // per_page)
    physical = torch.randperm(pool_rows // per_page, generator=g, device=device)[: B * pages].view(B, pages)
    t = torch.arange(R, device=device)
    return (physical[:, t // per_page] * per_page + t % per_page).to(torch.int32)


def v41_index_case(mode: str, B: int, n: int, start: int, ratio: int, staged: bool, device,
                   seed: int = 0) -> V41IndexCase:
    """mode "full" or "cand"; n query tokens per sequence at positions start .. start + n - 1."""
    g = torch.Generator(device=device).manual_seed(seed)
    H, D = V41_INDEX_HEADS, V41_INDEX_DIM
    R = (start + n) // ratio
    pool_rows = STAGED_ROWS if staged else B * (-(-R // (PAGE // ratio)) * (PAGE // ratio)) + PAGE
    keys = (torch.randn(pool_rows, D, generator=g, device=device) * 2).bfloat16()
    pool = pack_rows(keys, ROW_FORMAT)
    del keys
    key_rows = _paged_rows(B, R, ratio, pool_rows, g, device)
    pos = torch.arange(start, start + n, device=device)
    n_visible = ((pos + 1) // ratio).to(torch.int32)[None].expand(B, n).contiguous()
    q = apply_kv_format(torch.randn(B, n, H, D, generator=g, device=device).bfloat16(), ROW_FORMAT)
    w = (torch.randn(B, n, H, generator=g, device=device) * (D**-0.5 * H**-0.5)).bfloat16()
    cands = None
    if mode == "cand":
        source = torch.randn(B * n, R, generator=g, device=device).bfloat16()
        source = source.masked_fill(torch.arange(R, device=device)[None] >= n_visible.reshape(-1, 1), float("-inf"))
        ids = candidate_blocks(source, n_visible.reshape(-1), CAND_BLOCK, CAND_BLOCKS)
        cands = torch.nn.functional.pad(ids, (0, CAND_BLOCKS - ids.shape[1]), value=-1).view(B, n, CAND_BLOCKS)
    return V41IndexCase(q, w, pool, key_rows, n_visible, cands)


def v41_index_work(case: V41IndexCase) -> tuple[int, int]:
    """(bytes, FLOPs) the op must move and compute: q, w, the distinct key rows and their key_rows
    entries read once (candidate lists too), the bf16 scores written once; 2 H D per live
    (query, key) pair."""
    B, S, H, D = case.q.shape
    row_bytes = case.pool.shape[1]
    if case.cand_blocks is None:
        R = case.key_rows.shape[1]
        seen = case.n_visible.clamp(max=R)
        live = int(seen.sum())
        rows = int(seen.amax(1).sum())
        out = B * S * R
        extra = 0
    else:
        blocks = case.cand_blocks.long()
        cols = (blocks[..., None] * CAND_BLOCK + torch.arange(CAND_BLOCK, device=blocks.device)).flatten(2)
        ok = (blocks[..., None] >= 0).expand(-1, -1, -1, CAND_BLOCK).flatten(2) & (cols < case.n_visible[..., None])
        live = int(ok.sum())
        per_seq = [torch.unique(cols[b][ok[b]]).numel() for b in range(B)]
        rows = sum(per_seq)
        out = B * S * cols.shape[2]
        extra = case.cand_blocks.numel() * 4
    nbytes = case.q.numel() * 2 + case.w.numel() * 2 + rows * (row_bytes + 4) + out * 2 + extra
    return nbytes, 2 * H * D * live


def build_v41_index(mode, B, n, start, ratio, staged, device, seed=0):
    """-> (fn, bytes, flops, bytes of one input set) for bench/kernels.py."""
    case = v41_index_case(mode, B, n, start, ratio, staged, device, seed)
    nbytes, flops = v41_index_work(case)
    set_bytes = nbytes + (case.pool.numel() if staged else 0)
    return case.run, nbytes, flops, set_bytes


def v41_index_shapes():
    """The PR's 13 shapes: name -> ("v41_index", builder args)."""
    s = {}
    for n, start, r in ((2048, 0, 2), (8192, 0, 2), (2048, 129024, 2), (128, 8064, 1), (128, 130944, 1)):
        s[f"full prefill n{n} start{start} r{r}"] = ("v41_index", ("full", 1, n, start, r, False))
    for start in (8064, 130944):
        s[f"cand prefill n128 start{start} NC16384"] = ("v41_index", ("cand", 1, 128, start, 1, False))
    for B, ctx, r in ((1, 32768, 2), (4, 32768, 2), (1, 131072, 2), (1, 131072, 1)):
        s[f"full decode B{B} ctx{ctx} r{r} staged1M"] = ("v41_index", ("full", B, 1, ctx - 1, r, True))
    for B in (1, 4):
        s[f"cand decode B{B} ctx131072 NC16384"] = ("v41_index", ("cand", B, 1, 131071, 1, False))
    return s
