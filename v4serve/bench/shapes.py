"""The PR's benchmark shapes, built as a real DeepSeek-V4 cache at that position would hold them.

64 heads, head dim 512, 128-token window, indexer top-k 512; r = compress ratio. A prefill chunk
of S tokens starting at `start` attends over a per-step window buffer (the 128 rows left by the
previous chunk followed by the chunk's own rows) and over the compressed rows visible to each
token ((p + 1) // r of them), r4 picking its top-k by random scores, r128 taking all of them.
`counts` carries the live compressed count, as the engine passes it.
"""

from dataclasses import dataclass

import torch

from v4serve.bench.v41_index_case import v41_index_shapes
from v4serve.ops.indexer import select_topk

HEADS, HEAD_DIM, WINDOW, TOPK = 64, 512, 128, 512

# name -> FreeToken PR "new38" time on an H100, µs
PR_NEW38_US = {
    "sparse prefill r4 S2048": 2887.86,
    "sparse prefill r4 S8192": 11399.31,
    "sparse prefill r4 S4096@28672": 5762.74,
    "sparse prefill r128 S8192": 3672.89,
    "sparse prefill r0 S8192": 2561.59,
    "sparse decode r4 B1 pos32767": 16.83,
    "sparse decode r128 B1 pos32767": 15.98,
    "sparse decode r0 B1 pos32767": 13.37,
    "sparse decode r4 B8 pos32767": 20.81,
    "sparse decode r128 B8 pos32767": 17.73,
    "sparse decode r0 B8 pos32767": 13.89,
    "gated_pool B1 R8 D128": 1.97,
    "gated_pool B1 R8 D512": 1.99,
    "gated_pool B1 R128 D128": 15.23,
    "gated_pool B1 R128 D512": 17.05,
    "gated_pool B8 R8 D128": 2.03,
    "gated_pool B8 R8 D512": 2.08,
    "gated_pool B8 R128 D128": 15.46,
    "gated_pool B8 R128 D512": 16.43,
    # DeepSeek-V4.1 indexer (FreeToken PR "read dsv41 indexer key rows as int32 words", new@3.8)
    "full prefill n2048 start0 r2": 156.38,
    "full prefill n8192 start0 r2": 2172.03,
    "full prefill n2048 start129024 r2": 17157.43,
    "full prefill n128 start8064 r1": 163.01,
    "full prefill n128 start130944 r1": 2639.19,
    "cand prefill n128 start8064 NC16384": 207.36,
    "cand prefill n128 start130944 NC16384": 211.15,
    "full decode B1 ctx32768 r2 staged1M": 5.47,
    "full decode B4 ctx32768 r2 staged1M": 16.39,
    "full decode B1 ctx131072 r2 staged1M": 16.38,
    "full decode B1 ctx131072 r1 staged1M": 31.37,
    "cand decode B1 ctx131072 NC16384": 4.51,
    "cand decode B4 ctx131072 NC16384": 9.17,
}

# our own targets on the H200, µs (the list)
TARGET_US = {
    "sparse prefill r4 S8192": 4000.0,
    "sparse prefill r128 S8192": 1000.0,
    "sparse prefill r0 S8192": 800.0,
    "sparse decode r4 B1 pos32767": 8.0,
    "sparse decode r4 B8 pos32767": 10.0,
    "sparse decode r0 B1 pos32767": 6.0,
    "gated_pool B1 R128 D512": 5.0,
    "gated_pool B1 R8 D512": 2.0,
    # issue 19 (V4.1 indexer): besides >= 2x faster than the PR's H100 new@3.8 time on every shape
    "full prefill n2048 start129024 r2": 6000.0,
    "full prefill n8192 start0 r2": 800.0,
    "full decode B1 ctx131072 r2 staged1M": 6.0,
    "cand decode B1 ctx131072 NC16384": 2.5,
}


@dataclass
class SparseCase:
    q: torch.Tensor
    win_pool: torch.Tensor
    cmp_pool: torch.Tensor
    idx: torch.Tensor
    counts: torch.Tensor
    sink: torch.Tensor
    scale: float = HEAD_DIM**-0.5

    def args(self):
        return (self.q, self.win_pool, self.cmp_pool, self.idx, WINDOW, self.sink, self.scale, self.counts)


def _compressed_picks(positions: torch.Tensor, ratio: int, n_rows: int, k: int, g: torch.Generator) -> torch.Tensor:
    """[T, k] compressed row ids per query position: top-k by random score (r4) or all (r128)."""
    visible = (positions + 1) // ratio
    cols = torch.arange(n_rows, device=positions.device)
    out = []
    for chunk in torch.split(torch.arange(len(positions), device=positions.device), 512):
        mask = cols[None, :] < visible[chunk, None]
        if ratio == 4:
            scores = torch.rand(len(chunk), n_rows, generator=g, device=positions.device)
            out.append(select_topk(scores.masked_fill(~mask, float("-inf")), k))
        else:
            out.append(torch.where(mask, cols[None, :], -1)[:, :k].to(torch.int32))
    return torch.cat(out)


def sparse_prefill_case(ratio: int, S: int, start: int, device, seed: int = 0) -> SparseCase:
    g = torch.Generator(device=device).manual_seed(seed)
    pos = torch.arange(start, start + S, device=device)
    # window buffer: rows 0..127 hold positions start-128..start-1, then the chunk's own rows
    window_pos = pos[:, None] - torch.arange(WINDOW - 1, -1, -1, device=device)[None, :]
    win_idx = torch.where(window_pos >= 0, window_pos - start + WINDOW, -1)
    n_cmp = (start + S) // ratio if ratio else 0
    k = (TOPK if ratio == 4 else n_cmp) if ratio else 0
    cmp_idx = _compressed_picks(pos, ratio, n_cmp, k, g) if ratio else win_idx[:, :0]
    idx = torch.cat([win_idx, cmp_idx], 1).to(torch.int32)[None]
    return SparseCase(
        q=torch.randn(1, S, HEADS, HEAD_DIM, generator=g, device=device).bfloat16(),
        win_pool=torch.randn(WINDOW + S, HEAD_DIM, generator=g, device=device).bfloat16(),
        cmp_pool=torch.randn(max(n_cmp, 1), HEAD_DIM, generator=g, device=device).bfloat16(),
        idx=idx,
        counts=(cmp_idx >= 0).sum(1).to(torch.int32)[None],
        sink=torch.randn(HEADS, generator=g, device=device),
    )


def sparse_decode_case(ratio: int, B: int, pos: int, device, seed: int = 0, columns: int | None = None) -> SparseCase:
    """B requests at position `pos`: a 128-row window ring each, (pos + 1) // r compressed rows each.
    columns: the width of the compressed part of the table when wider than the live picks (an HCA
    layer's table is max_model_len / 128 wide whatever the context): -1 past the live ones."""
    g = torch.Generator(device=device).manual_seed(seed)
    n_cmp = (pos + 1) // ratio if ratio else 0
    k = (TOPK if ratio == 4 else n_cmp) if ratio else 0
    win_idx = torch.arange(B, device=device)[:, None] * WINDOW + torch.arange(WINDOW, device=device)[None, :]
    positions = torch.full((B,), pos, device=device)
    picks = _compressed_picks(positions, ratio, n_cmp, k, g) if ratio else win_idx[:, :0].int()
    if columns is not None and columns > picks.shape[1]:
        picks = torch.nn.functional.pad(picks, (0, columns - picks.shape[1]), value=-1)
    cmp_idx = torch.where(picks >= 0, picks + torch.arange(B, device=device)[:, None] * n_cmp, -1)
    idx = torch.cat([win_idx, cmp_idx], 1).to(torch.int32)[:, None]
    return SparseCase(
        q=torch.randn(B, 1, HEADS, HEAD_DIM, generator=g, device=device).bfloat16(),
        win_pool=torch.randn(B * WINDOW, HEAD_DIM, generator=g, device=device).bfloat16(),
        cmp_pool=torch.randn(max(B * n_cmp, 1), HEAD_DIM, generator=g, device=device).bfloat16(),
        idx=idx,
        counts=(cmp_idx >= 0).sum(1).to(torch.int32)[:, None],
        sink=torch.randn(HEADS, generator=g, device=device),
    )


def gated_pool_case(B: int, R: int, D: int, device, seed: int = 0):
    """fp32 kv and gate scores as the compressor state holds them (score = wgate x + ape)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(B, R, D, generator=g, device=device), torch.randn(B, R, D, generator=g, device=device))


def indexer_case(B: int, S: int, start: int, device, seed: int = 0, ratio: int = 4, heads: int = 64, dim: int = 128,
                 columns: int | None = None):
    """V4 indexer scores for S query tokens per request at positions start.. (decode: S = 1):
    64 index heads x 128, bf16 keys of the (start + S) // ratio compressed rows, each query seeing
    (p + 1) // ratio of them; weights fp32 with the scales folded in, as the model passes them.
    columns: the key-row table's width when the cache is wider than the context (max_model_len //
    ratio): the columns past the context are -1, unallocated pages."""
    g = torch.Generator(device=device).manual_seed(seed)
    T = (start + S) // ratio
    pos = torch.arange(start, start + S, device=device)
    k_pool = torch.randn(B * T + 64, dim, generator=g, device=device).bfloat16()
    key_rows = torch.randperm(B * T + 64, generator=g, device=device)[: B * T].view(B, T).to(torch.int32)
    if columns is not None:
        key_rows = torch.nn.functional.pad(key_rows, (0, columns - T), value=-1)
    return (
        torch.randn(B, S, heads, dim, generator=g, device=device).bfloat16(),
        torch.randn(B, S, heads, generator=g, device=device) * (dim**-0.5 * heads**-0.5),
        k_pool,
        key_rows,
        ((pos + 1) // ratio).to(torch.int32)[None].expand(B, S).contiguous(),
    )


def mhc_case(T: int, device, seed: int = 0, n: int = 4, hidden: int = 4096):
    """One mHC sublayer's inputs at V4-Flash dimensions: streams [T, n, hidden] bf16, fn
    [(2+n)n, n*hidden] fp32 (1.5 MB), base [(2+n)n] and scale [3] fp32."""
    g = torch.Generator(device=device).manual_seed(seed)
    m = (2 + n) * n
    return (
        torch.randn(T, n, hidden, generator=g, device=device).bfloat16(),
        torch.randn(m, n * hidden, generator=g, device=device) * (n * hidden) ** -0.5,
        torch.randn(m, generator=g, device=device),
        torch.rand(3, generator=g, device=device) + 0.5,
    )


def quant_case(rows: int, D: int, device, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(rows, D, generator=g, device=device).bfloat16()


# ---- quantized weights (ops/fp8_linear.py, ops/mxfp4_grouped_matmul.py) ----
# FP8 block-scaled projections (out, in) with 128x128 ue8m0 blocks; MoE geometry (experts, hidden,
# intermediate) of the MXFP4 routed experts, top-6.
FP8_PROJECTIONS = {
    "flash": {"wq_a": (1024, 4096), "wq_b": (32768, 1024), "wkv": (512, 4096), "wo_b": (4096, 8192),
              "shared_w1": (2048, 4096), "shared_w2": (4096, 2048)},
    "pro": {"wq_a": (1536, 7168), "wq_b": (65536, 1536), "wkv": (512, 7168), "wo_b": (7168, 16384),
            "shared_w1": (3072, 7168), "shared_w2": (7168, 3072)},
}
# The MTP drafts' FP8 copy of the lm head (speculative_config draft_head "fp8"): (vocab, hidden).
FP8_DRAFT_HEADS = {"flash": (129280, 4096), "pro": (129280, 7168)}
MOE_GEOMETRY = {"flash": (256, 4096, 2048), "pro": (384, 7168, 3072)}
MOE_TOP_K = 6


def fp8_linear_case(n: int, k: int, m: int, device, seed: int = 0):
    """(x bf16 [M, K], weight e4m3 [N, K], scale fp32 [N/128, K/128] powers of two), as a checkpoint holds them."""
    g = torch.Generator(device=device).manual_seed(seed)
    weight = (torch.randn(n, k, generator=g, device=device) * 16).to(torch.float8_e4m3fn)
    scale = torch.exp2(torch.randint(-14, -8, (-(-n // 128), -(-k // 128)), generator=g, device=device).float())
    return torch.randn(m, k, generator=g, device=device).bfloat16(), weight, scale


def mxfp4_moe_case(model: str, tokens: int, device, seed: int = 0):
    """One routed MoE layer's inputs: x bf16 [T, D], router logits bf16 [T, E] (uniform routing),
    fused gate_up packed [E, 2I, D/2] + ue8m0 scales [E, 2I, D/32], down [E, D, I/2] + [E, D, I/32]."""
    e, d, i = MOE_GEOMETRY[model]
    g = torch.Generator(device=device).manual_seed(seed)

    def packed(rows, cols):
        w = torch.randint(0, 256, (e, rows, cols // 2), generator=g, device=device, dtype=torch.int32).to(torch.uint8)
        s = torch.randint(118, 122, (e, rows, cols // 32), generator=g, device=device, dtype=torch.int32)
        return w, s.to(torch.uint8)

    return (torch.randn(tokens, d, generator=g, device=device).bfloat16(),
            torch.randn(tokens, e, generator=g, device=device).bfloat16(), *packed(2 * i, d), *packed(d, i))


def expert_fetch_case(model: str, n_experts: int, device, seed: int = 0):
    """Offloaded-expert fetch: `n_experts` MXFP4 experts of `model` (their four tensors) in pinned
    host memory, the device rows they are copied into (a layer's 12 slots after 4 resident rows),
    and the copy list (count, slot, host row) as expert_cache_plan writes it."""
    e, d, i = MOE_GEOMETRY[model]
    g = torch.Generator().manual_seed(seed)
    shapes = ((2 * i, d // 2), (2 * i, d // 32), (d, i // 2), (d, i // 32))
    hosts = [torch.randint(0, 256, (n_experts, *s), generator=g, dtype=torch.uint8).pin_memory() for s in shapes]
    devices = [torch.zeros(4 + 12, *s, dtype=torch.uint8, device=device) for s in shapes]
    count = torch.tensor([n_experts], device=device)
    slots = torch.full((12,), -1, device=device)
    rows = torch.full((12,), -1, device=device)
    slots[:n_experts] = torch.arange(n_experts, device=device).flip(0)
    rows[:n_experts] = torch.arange(n_experts, device=device)
    return hosts, devices, count, slots, rows


def quant_weight_shapes():
    """name -> (kind, builder args) of the quantized-weight rows."""
    shapes = {}
    for model, table in FP8_PROJECTIONS.items():
        for proj, (n, k) in table.items():
            for m in (1, 8, 64, 2048):  # the official numerics: activations e4m3 per 128, FP8 MMA
                shapes[f"fp8 linear {model} {proj} M{m}"] = ("fp8_linear", (n, k, m, 128))
            for m in (1, 2048):  # weight-only numerics (bf16 MMA on dequantized tiles)
                shapes[f"fp8 linear w8a16 {model} {proj} M{m}"] = ("fp8_linear", (n, k, m, None))
    for model, (n, k) in FP8_DRAFT_HEADS.items():
        for m in (1, 8):  # a draft step at c1 / c8 (weight-only numerics, as the module runs it)
            shapes[f"fp8 linear w8a16 {model} draft_head M{m}"] = ("fp8_linear", (n, k, m, None))
    for model in MOE_GEOMETRY:
        for c in (1, 8, 64):
            shapes[f"mxfp4 moe {model} c{c}"] = ("mxfp4_moe", (model, c))
        shapes[f"mxfp4 moe {model} prefill S2048"] = ("mxfp4_moe", (model, 2048))
    # offloaded experts host -> device slots (floor: the host link, HOST_LINK_GBPS in bench/kernels.py)
    for n in (1, 6, 12):
        shapes[f"expert fetch flash E{n}"] = ("expert_fetch", ("flash", n))
    shapes["expert copy-engine flash E6"] = ("expert_copy_engine", ("flash", 6))
    return shapes


def all_shapes():
    """name -> (kind, builder args)."""
    shapes = {
        "sparse prefill r4 S2048": ("prefill", (4, 2048, 0)),
        "sparse prefill r4 S8192": ("prefill", (4, 8192, 0)),
        "sparse prefill r4 S4096@28672": ("prefill", (4, 4096, 28672)),
        "sparse prefill r128 S8192": ("prefill", (128, 8192, 0)),
        "sparse prefill r0 S8192": ("prefill", (0, 8192, 0)),
    }
    for B in (1, 8):
        for r in (4, 128, 0):
            shapes[f"sparse decode r{r} B{B} pos32767"] = ("decode", (r, B, 32767))
    for B in (1, 8):
        for R in (8, 128):
            for D in (128, 512):
                shapes[f"gated_pool B{B} R{R} D{D}"] = ("gated_pool", (B, R, D))
    # V4 indexer (64 heads x 128, ratio 4): decode at pos 32767 scores all 8192 compressed rows
    shapes["indexer scores decode B1 pos32767"] = ("indexer", (1, 1, 32767))
    shapes["indexer scores decode B8 pos32767"] = ("indexer", (8, 1, 32767))
    shapes["indexer scores prefill S2048"] = ("indexer", (1, 2048, 0))
    shapes["indexer scores prefill S2048@28672"] = ("indexer", (1, 2048, 28672))
    # mHC sublayer entry at decode sizes (16 of each per step of an 8-layer Flash model)
    for op in ("mix", "coefficients"):
        for T in (1, 8, 64):
            shapes[f"mhc {op} T{T}"] = ("mhc", (op, T))
    # KV row round trips (a decode step's B rows; a prefill chunk's rows)
    for fmt, D in (("fp8_e8m0_b64_rope64", 512), ("fp4_e8m0_b32", 128)):
        for rows in (8, 8192):
            shapes[f"kv round trip {fmt} R{rows} D{D}"] = ("quant", (fmt, rows, D))
    # ---- packed KV rows (issue 17): every sparse-attention and indexer shape again over packed
    # pools (fp8_e8m0_b64_rope64 rows, fp4_e8m0_b32 index keys), kind "<kind>_fp8kv" ----
    for name, (kind, args) in list(shapes.items()):
        if kind in ("prefill", "decode", "indexer"):
            shapes[f"{name} fp8kv"] = (f"{kind}_fp8kv", args)
    # the compaction alone that prefill over packed rows runs first (ops/kv_compact.py)
    for name, (kind, args) in list(shapes.items()):
        if kind == "prefill":
            shapes[name.replace("sparse prefill", "kv compact")] = ("kv_compact", args)
    shapes.update(quant_weight_shapes())
    from v4serve.bench.decode_fusion_case import decode_fusion_shapes

    shapes.update(decode_fusion_shapes())  # the decode step's fused small kernels (session 12)
    from v4serve.bench.o_a_case import o_a_shapes

    shapes.update(o_a_shapes())  # the grouped output projection, bf16 vs FP8 routes (bench/o_a_case.py)
    from v4serve.bench.launch_glue_case import launch_glue_shapes

    shapes.update(launch_glue_shapes())  # the decode step's launch-glue fusions (session 13)
    shapes.update(v41_index_shapes())  # DeepSeek-V4.1 indexer over packed fp4 keys (bench/v41_index_case.py)
    from v4serve.bench.v41_attn_case import v41_attn_shapes  # (imports this module)

    shapes.update(v41_attn_shapes())  # DeepSeek-V4.1 attention over its two packed formats; Engram lookup
    return shapes
