"""Inputs of the V4.1 indexer as the model hands them over (shared by the CPU and GPU tests).

q and keys are fp4_e8m0_b32 values (the keys also as their packed rows), weights bf16. Two kinds:
`exact=False` draws normal q / keys (the model's case: group scales vary, the head sum rounds);
`exact=True` draws e2m1 grid values with every group's amax 6 (scale 1) and weights +-2^e, e in
[-2, 2], so every dot, product and fp32 head sum is exact and every summation order gives the
same bits.
"""

import torch

from v4serve.ops.kv_pack import pack_rows
from v4serve.ops.kv_quant import apply_kv_format

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _grid_values(shape, g) -> torch.Tensor:
    """e2m1 grid values with the first element of every 32-channel group +-6 (scale 2^0)."""
    v = E2M1_GRID[torch.randint(0, 8, shape, generator=g)]
    v = torch.where(torch.rand(shape, generator=g) < 0.5, -v, v)
    v = v.view(*shape[:-1], shape[-1] // 32, 32)
    v[..., 0] = 6.0
    return v.view(shape)


def index_inputs(B, S, H, D, R, n_pool, *, exact, seed=0, hole_fraction=0.1, device="cpu"):
    """(q [B, S, H, D] bf16, w [B, S, H] bf16, packed pool uint8 [n_pool, 68-ish], bf16 pool
    [n_pool, D], key_rows [B, R] int32 with holes)."""
    g = torch.Generator().manual_seed(seed)
    if exact:
        q = _grid_values((B, S, H, D), g).bfloat16()
        keys = _grid_values((n_pool, D), g).bfloat16()
        e = torch.randint(-2, 3, (B, S, H), generator=g).float()
        w = (torch.exp2(e) * torch.where(torch.rand(B, S, H, generator=g) < 0.3, -1.0, 1.0)).bfloat16()
    else:
        q = apply_kv_format(torch.randn(B, S, H, D, generator=g).bfloat16(), "fp4_e8m0_b32", impl="torch")
        keys = apply_kv_format((torch.randn(n_pool, D, generator=g) * 2).bfloat16(), "fp4_e8m0_b32", impl="torch")
        w = (torch.randn(B, S, H, generator=g) * (D**-0.5 * H**-0.5)).bfloat16()
    packed = pack_rows(keys, "fp4_e8m0_b32", impl="torch")
    rows = torch.stack([torch.randperm(n_pool, generator=g)[:R] for _ in range(B)])
    rows = torch.where(torch.rand(B, R, generator=g) < hole_fraction, -1, rows).to(torch.int32)
    to = lambda t: t.to(device)  # noqa: E731
    return to(q), to(w), to(packed), to(keys), to(rows)


def head_sum_bound(q, w, keys, key_rows, n_visible) -> torch.Tensor:
    """fp32 [B, S, R]: the bound on |kernel - reference| that the head-sum order allows: one bf16
    ulp of the reference score plus 2 (H - 1) 2^-24 sum_h |p[h]| (see v41_index_triton.py)."""
    k = keys[key_rows.clamp(min=0).long()].float()  # [B, R, D]
    logits = torch.einsum("bshd,brd->bshr", q.float(), k).bfloat16().float().relu()
    p = (logits * w.float()[..., None]).bfloat16().float()
    H = q.shape[2]
    return 2 * (H - 1) * 2.0**-24 * p.abs().sum(2)
