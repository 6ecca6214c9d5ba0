"""Benchmark rows of session 13's launch-glue fusions, each beside the launches it replaced
(`bench kernels --only 'glue '`):

* `glue kv q_a norm T{T}`: the window append (kv_norm + RoPE at D 512, packed into fp8_e8m0_b64_rope64
  rows) with the q_a_norm of the 1024-channel low-rank q in the same launch, against `unglue kv q_a
  norm T{T}` (the append, then the q_a_norm as a launch of its own); both inputs are column views of
  one [T, 1536] projection, as the fused q_a + kv GEMM leaves them;
* `glue pick columns B{B} T{T}`: a CSA decode step's columns (128 window columns, then the top-512
  rows of a sorted [B, T] ranking) in one launch, against `unglue pick columns B{B} T{T}` (gather,
  then cat).
"""

import torch

from v4serve.formats import row_format
from v4serve.ops.norm_rope import rms_norm_rope
from v4serve.ops.pick_columns import pick_columns

KV_DIM, Q_RANK, ROPE_PAIRS, WINDOW, TOPK = 512, 1024, 32, 128, 512
KV_FORMAT = "fp8_e8m0_b64_rope64"


def launch_glue_shapes() -> dict:
    shapes = {}
    for glued in (True, False):
        prefix = "glue" if glued else "unglue"
        for T in (1, 8):
            shapes[f"{prefix} kv q_a norm T{T}"] = ("glue_norm_pair", (T, glued))
        for B, T in ((1, 8192), (8, 8192)):
            shapes[f"{prefix} pick columns B{B} T{T}"] = ("glue_pick_columns", (B, T, glued))
    return shapes


def build_launch_glue(kind, args, device, seed=0):
    """-> (fn, bytes, flops, bytes of one input set)."""
    g = torch.Generator(device=device).manual_seed(seed)
    if kind == "glue_norm_pair":
        T, glued = args
        projected = torch.randn(T, Q_RANK + KV_DIM, generator=g, device=device).bfloat16()
        q_low, kv = projected[:, :Q_RANK], projected[:, Q_RANK:]
        w_kv = (torch.rand(KV_DIM, generator=g, device=device) + 0.5).bfloat16()
        w_q = (torch.rand(Q_RANK, generator=g, device=device) + 0.5).bfloat16()
        angles = torch.rand(T, ROPE_PAIRS, generator=g, device=device) * 6.28
        cos, sin = angles.cos(), angles.sin()
        fmt = row_format(KV_FORMAT)
        pool = torch.zeros(4 * T, fmt.row_bytes(KV_DIM), dtype=torch.uint8, device=device)
        rows = torch.arange(T, device=device) * 4
        store = dict(pool=pool, rows=rows, row_format=KV_FORMAT)
        nbytes = projected.numel() * 2 * 2 + T * fmt.row_bytes(KV_DIM)
        if glued:
            return (lambda: rms_norm_rope(kv, 1e-6, w_kv, cos, sin, also_norm=(q_low, w_q), **store)), nbytes, 0, nbytes

        def unglued():
            rms_norm_rope(kv, 1e-6, w_kv, cos, sin, **store)
            return rms_norm_rope(q_low, 1e-6, w_q)
        return unglued, nbytes, 0, nbytes
    if kind == "glue_pick_columns":
        B, T, glued = args
        prefix = torch.randint(0, 1 << 20, (B, WINDOW), generator=g, device=device, dtype=torch.int32)
        rows_of = torch.randint(0, 1 << 20, (B, T), generator=g, device=device, dtype=torch.int32)
        order = torch.argsort(torch.rand(B, T, generator=g, device=device), dim=1)[:, :TOPK]
        nbytes = B * (WINDOW * 4 + TOPK * (8 + 4) + (WINDOW + TOPK) * 4)
        if glued:
            return (lambda: pick_columns(prefix, rows_of, order, TOPK)), nbytes, 0, nbytes
        return (lambda: torch.cat((prefix, rows_of.gather(1, order)), dim=1)), nbytes, 0, nbytes
    raise ValueError(f"unknown launch-glue kind {kind!r}")
