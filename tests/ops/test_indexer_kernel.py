"""The indexer-scores kernel (ops/indexer_triton.py) at tiny shapes on the CPU (TRITON_INTERPRET=1):
every tile configuration the launcher can take (prefill query blocks, decode splits, several key
blocks per split, the decode-first variant) against the torch reference, and the fp4 word decode
against the reference unpack for every code byte and scale byte (also on the GPU, where the packed
bf16 multiplies run in hardware)."""

import pytest
import torch
from cases import rel_err

from v4serve.formats import row_format
from v4serve.ops.indexer import index_scores
from v4serve.ops.indexer_triton import DECODE_CONFIG, PREFILL_CONFIG, PREFILL_CONFIG_Q2, _decoded_keys, index_scores_triton
from v4serve.ops.kv_pack import pack_rows
from v4serve.ops.kv_pack_reference import unpack_rows_reference

FP4 = row_format("fp4_e8m0_b32")
CONFIGS = {
    "prefill": PREFILL_CONFIG,
    "prefill, 2 queries": PREFILL_CONFIG_Q2,
    "decode": DECODE_CONFIG,
    "two blocks per split": dict(BLOCK_Q=2, BLOCK_T=16, BLOCKS_PER_SPLIT=2, num_warps=4, num_stages=1),
}


def _case(seed, B=2, S=5, H=20, Dk=64, T=45, N=60, integers=False):
    """q as a strided view, holes in key_rows, visible counts from 0 to past T."""
    g = torch.Generator().manual_seed(seed)
    draw = (lambda *s: torch.randint(-3, 4, s, generator=g).float()) if integers else (lambda *s: torch.randn(*s, generator=g))
    q = draw(B, S, H, 2 * Dk).bfloat16()[..., ::2]
    w = draw(B, S, H)
    keys = draw(N, Dk) * (1.0 if integers else torch.exp2(torch.randint(-20, 20, (N, 1), generator=g).float()))
    key_rows = torch.randint(-1, N, (B, T), generator=g).to(torch.int32)
    n_visible = torch.randint(0, T + 3, (B, S), generator=g).to(torch.int32)
    n_visible[0, 0], n_visible[-1, -1] = 0, T
    return q, w, keys.bfloat16(), key_rows, n_visible


@pytest.mark.parametrize("config", CONFIGS)
def test_scores_over_bf16_keys_match_the_reference(config):
    q, w, keys, key_rows, n_visible = _case(seed=1)
    out = index_scores_triton(q, w, keys, key_rows, n_visible, config=CONFIGS[config])
    ref = index_scores(q, w, keys, key_rows, n_visible, impl="torch")
    finite = torch.isfinite(ref)
    assert finite.any() and (~finite).any()
    assert torch.equal(torch.isfinite(out), finite)
    assert rel_err(out[finite], ref[finite]) < 1e-5


@pytest.mark.parametrize("decode_first", [False, True])
@pytest.mark.parametrize("config", CONFIGS)
def test_scores_over_packed_keys_are_the_scores_over_their_values(config, decode_first):
    """Integer-valued q, w and keys (e2m1 values times 2^0): every product and partial sum is exact in
    fp32, so any summation order gives the same bits: packed keys must score exactly as their bf16
    values do, and a key read at the wrong channel or scale shows."""
    q, w, keys, key_rows, n_visible = _case(seed=2, Dk=128, integers=True)
    packed = pack_rows(keys, FP4, impl="torch")
    assert torch.equal(unpack_rows_reference(packed, FP4, 128, torch.bfloat16), keys)  # the case is exact in fp4
    cfg = dict(CONFIGS[config], DECODE_FIRST=decode_first)
    out = index_scores_triton(q, w, packed, key_rows, n_visible, config=cfg, row_format=FP4)
    ref = index_scores(q, w, keys, key_rows, n_visible, impl="torch")
    assert torch.isfinite(ref).any() and torch.equal(out, ref)


def _pair_order_to_channels(slab):
    """Columns 8i + 2j + half (decode_fp4_words' order) back to channels 8i + j + 4 half."""
    n, d = slab.shape
    return slab.view(n, d // 8, 4, 2).transpose(2, 3).reshape(n, d)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fp4_word_decode_is_the_reference_unpack_for_every_code_and_scale(device):
    """64 rows x 64 code bytes cover every byte (every pair of e2m1 codes, signed zeros included)
    and 64 x 4 scale bytes cover every ue8m0 exponent 0..254 (2^-127 reads as 0, as in the
    reference; the smallest nonzero value, 0.5 * 2^-126, is a bf16 subnormal)."""
    r = torch.arange(64)
    packed = torch.zeros(64, FP4.row_bytes(128), dtype=torch.uint8)
    packed[:, :64] = ((4 * r[:, None] + torch.arange(64)[None, :]) % 256).to(torch.uint8)
    packed[:, 64:68] = ((4 * r[:, None] + torch.arange(4)[None, :]) % 255).to(torch.uint8)
    key_rows = torch.randperm(64, generator=torch.Generator().manual_seed(3)).to(torch.int32).view(2, 32)
    key_rows[1, 5] = -1
    slab, slab_rows = _decoded_keys(packed.to(device).view(torch.int32), key_rows.to(device), 128)
    ref = unpack_rows_reference(packed[key_rows.clamp(min=0).flatten()], FP4, 128, torch.bfloat16)
    ref[32 + 5] = 0.0  # a hole decodes as zeros
    got = _pair_order_to_channels(slab.cpu())
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))
    assert torch.equal(slab_rows.cpu(), torch.where(key_rows >= 0, torch.arange(64, dtype=torch.int32).view(2, 32), -1))


@pytest.mark.parametrize("config", ["prefill", "decode"])
@pytest.mark.parametrize("packed", [False, True])
def test_weight_scale_in_the_kernel_is_the_scaled_weights_bit_for_bit(config, packed):
    """The model's constant head-weight scale (index_head_dim^-0.5 * index_n_heads^-0.5, not a power
    of two) multiplied in the kernel scores exactly as the weights multiplied by torch beforehand."""
    q, w, keys, key_rows, n_visible = _case(seed=3, Dk=128)
    fmt = dict(row_format=FP4) if packed else {}
    pool = pack_rows(keys, FP4, impl="torch") if packed else keys
    scale = 128**-0.5 * 20**-0.5
    scaled = index_scores_triton(q, w, pool, key_rows, n_visible, config=CONFIGS[config], weight_scale=scale, **fmt)
    want = index_scores_triton(q, w * scale, pool, key_rows, n_visible, config=CONFIGS[config], **fmt)
    assert torch.equal(scaled, want) and torch.isfinite(want).any()
    ref = index_scores(q, w, pool, key_rows, n_visible, impl="torch", weight_scale=scale, **fmt)
    assert torch.equal(ref, index_scores(q, w * scale, pool, key_rows, n_visible, impl="torch", **fmt))
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(scaled), finite) and rel_err(scaled[finite], ref[finite]) < 1e-5


@pytest.mark.parametrize("packed", [False, True])
def test_decode_over_a_wide_table_scores_the_live_blocks_and_masks_the_rest(packed):
    """A decode step of a short context in a wide cache: one query per sequence over a 320-column
    table (5 blocks of 64) whose sequences see 0, 63, 64, 65 and 200 keys, the unallocated tail -1.
    Blocks past every visible key skip their loads (ops/indexer_triton.py) and must still write
    -inf; the live blocks must score as the reference does."""
    g = torch.Generator().manual_seed(4)
    B, T, H, Dk, N = 5, 320, 20, 128, 1700
    q = torch.randn(B, 1, H, Dk, generator=g).bfloat16()
    w = torch.randn(B, 1, H, generator=g)
    keys = torch.randn(N, Dk, generator=g).bfloat16()
    n_visible = torch.tensor([[0], [63], [64], [65], [200]], dtype=torch.int32)
    key_rows = torch.randperm(N, generator=g)[: B * T].view(B, T).to(torch.int32)
    allocated = torch.tensor([0, 64, 64, 128, 256])[:, None]  # whole pages: rows past them are -1
    key_rows = torch.where(torch.arange(T)[None, :] < allocated, key_rows, -1)
    fmt = dict(row_format=FP4) if packed else {}
    pool = pack_rows(keys, FP4, impl="torch") if packed else keys
    out = index_scores_triton(q, w, pool, key_rows, n_visible, config=CONFIGS["decode"], **fmt)
    ref = index_scores(q, w, pool, key_rows, n_visible, impl="torch", **fmt)
    finite = torch.isfinite(ref)
    assert torch.equal(finite.sum(-1).flatten(), n_visible.flatten())
    assert torch.equal(torch.isfinite(out), finite) and (out[~finite] == float("-inf")).all()
    assert rel_err(out[finite], ref[finite]) < 1e-5
