"""Gluon device functions over DeepSeek-V4's packed pool rows (`fp8_e8m0_b64_rope64`: e4m3 codes of
channels 0 .. NQ - 1, a bf16 RoPE tail, the ue8m0 scale of channels [64 g, 64 g + 64) in byte g of the
scale words; kv_pack_triton.py), shared by the two-pass Gluon kernels (sparse_attn_scores_gluon.py,
sparse_attn_values_gluon.py), and the rule of where those kernels apply."""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from v4serve.ops._dispatch import compiled_on_cuda

BLOCK = 64  # channels a scale block, and the bf16 tail's width


@gluon.jit
def tile_rows(tile, layout: gl.constexpr, tok, hi, n_window, win_ptr, cmp_ptr, idx_ptr, stride_it, stride_pool):
    """(byte pointers to the pool rows of the 64 columns of `tile`, which are live) in `layout` ([64]
    columns) for token `tok`: the window pool below n_window, the compressed pool above; holes and
    columns >= hi are not live (their pointers must be masked)."""
    cols = tile * 64 + gl.arange(0, 64, layout=layout)
    rows = gl.load(idx_ptr + stride_it * tok + cols, mask=cols < hi, other=-1)
    # NOTE: the hint keeps the loads and copies 16 bytes wide (the select loses the pointers' alignment).
    base = gl.multiple_of(gl.where(cols < n_window, win_ptr, cmp_ptr), 16)
    return base + rows.to(gl.int64) * stride_pool, rows >= 0


@gluon.jit
def e4m3_scaled_bf16(codes, words, shift):
    """bf16 values of e4m3 `codes` (uint8 [rows, channels]) times their row's scale 2^(b - 127), b the
    byte of `words` (int32 [rows]) at bit `shift`, exactly: the hardware conversion to fp32, one bf16
    pack and one bf16x2 multiply a pair (kv_pack_triton's `_e4m3_scaled_cvt_bf16`)."""
    scale = (((words >> shift) & 0xFF) << 7).to(gl.int16).to(gl.bfloat16, bitcast=True)
    return codes.to(gl.float8e4nv, bitcast=True).to(gl.float32).to(gl.bfloat16) * scale[:, None]


def v4_rows_apply(device: torch.device, pk: dict, D: int, block_t: int, pools) -> bool:
    """The two-pass Gluon kernels' common rule: compiled CUDA on sm_90 (wgmma; not the interpreter),
    `fp8_e8m0_b64_rope64` rows of D channels (`pk`: packed_constexprs; 64-channel scale blocks, a bf16
    tail of 64), the two-pass tile of 64 columns, 16-byte aligned pools and row strides."""
    if not pk or pk.get("PK_FP4", False) or not compiled_on_cuda(device):
        return False
    return (torch.cuda.get_device_capability(device) == (9, 0) and pk["PK_HAS_TAIL"]
            and pk["PK_BLOCK"] == BLOCK and pk["PK_NQ"] % BLOCK == 0 and D == pk["PK_NQ"] + BLOCK
            and pk["PK_SCALE_OFF"] - pk["PK_TAIL_OFF"] == 2 * BLOCK and pk["PK_TAIL_OFF"] % 16 == 0
            and block_t == 64 and all(pool.data_ptr() % 16 == 0 and pool.stride(-2) % 16 == 0 for pool in pools))
