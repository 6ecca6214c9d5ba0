"""The indexer-scores kernel at the bench shapes on the GPU (`pytest -m gpu tests/ops`): decode
B1 / B8 at pos 32767 (8192 keys), prefill S2048 at 0 and at 28672 (7680 keys), bf16 and packed
fp4_e8m0_b32 keys, the production tiles and the decode-first variant.

- against the torch reference (fp32 einsum over the same bf16 values): the same -inf pattern and
  relative error < 1e-5 (the kernel sums channels in the tensor core's order and heads in its own);
- the fused kernel (keys decoded per block) has the bits of the decode-first variant (keys decoded
  once into a bf16 slab in the same column order, then the bf16 kernel): the same dot operands;
- on integer-valued q, w and keys (every product and partial sum exact in fp32) packed keys score
  bit for bit as their bf16 values and as the reference, so a channel or scale read wrong shows.
"""

import pytest
import torch
from cases import rel_err

from v4serve.bench.shapes import all_shapes, indexer_case
from v4serve.formats import row_format
from v4serve.ops.indexer import index_scores
from v4serve.ops.indexer_triton import index_scores_config, index_scores_triton
from v4serve.ops.kv_pack import pack_rows, unpack_rows

pytestmark = pytest.mark.gpu

FP4 = row_format("fp4_e8m0_b32")
SHAPES = {n: args for n, (kind, args) in all_shapes().items() if kind == "indexer"}


def _case(name, integers=False):
    q, w, k_pool, key_rows, n_visible = indexer_case(*SHAPES[name], device="cuda", seed=len(name))
    if integers:
        g = torch.Generator(device="cuda").manual_seed(7)
        q = torch.randint(-3, 4, q.shape, generator=g, device="cuda").bfloat16()
        w = torch.randint(-3, 4, w.shape, generator=g, device="cuda").float()
        k_pool = torch.randint(-3, 4, k_pool.shape, generator=g, device="cuda").bfloat16()
    return q, w, k_pool, key_rows, n_visible


@pytest.mark.parametrize("keys", ["bf16", "fp4", "fp4 decode first"])
@pytest.mark.parametrize("name", SHAPES)
def test_scores_match_the_reference(name, keys):
    q, w, k_pool, key_rows, n_visible = _case(name)
    fmt = None if keys == "bf16" else FP4
    pool = k_pool if fmt is None else pack_rows(k_pool, FP4)
    values = k_pool if fmt is None else unpack_rows(pool, FP4, k_pool.shape[1], impl="torch")
    cfg = dict(index_scores_config(q.shape[1], q.device), DECODE_FIRST=keys == "fp4 decode first")
    out = index_scores_triton(q, w, pool, key_rows, n_visible, config=cfg, row_format=fmt)
    ref = index_scores(q, w, values, key_rows, n_visible, impl="torch")
    finite = torch.isfinite(ref)
    assert finite.any() and torch.equal(torch.isfinite(out), finite)
    assert rel_err(out[finite], ref[finite]) < 1e-5


@pytest.mark.parametrize("name", SHAPES)
def test_fused_decode_has_the_bits_of_decode_first(name):
    q, w, k_pool, key_rows, n_visible = _case(name)
    packed = pack_rows(k_pool, FP4)
    cfg = index_scores_config(q.shape[1], q.device)
    fused = index_scores_triton(q, w, packed, key_rows, n_visible, config=cfg, row_format=FP4)
    first = index_scores_triton(q, w, packed, key_rows, n_visible, config=dict(cfg, DECODE_FIRST=True), row_format=FP4)
    assert torch.isfinite(fused).any() and torch.equal(fused, first)


@pytest.mark.parametrize("name", SHAPES)
def test_packed_keys_score_exactly_as_their_values_on_integer_inputs(name):
    q, w, k_pool, key_rows, n_visible = _case(name, integers=True)
    packed = pack_rows(k_pool, FP4)
    assert torch.equal(unpack_rows(packed, FP4, k_pool.shape[1], impl="torch"), k_pool)  # exact in fp4
    out = index_scores(q, w, packed, key_rows, n_visible, row_format="fp4_e8m0_b32", impl="triton")
    bf16 = index_scores(q, w, k_pool, key_rows, n_visible, impl="triton")
    ref = index_scores(q, w, k_pool, key_rows, n_visible, impl="torch")
    assert torch.isfinite(ref).any() and torch.equal(out, ref) and torch.equal(bf16, ref)


@pytest.mark.parametrize("keys", ["bf16", "fp4"])
@pytest.mark.parametrize("name", [n for n in SHAPES if "decode" in n])
def test_weight_scale_in_the_kernel_is_the_scaled_weights_bit_for_bit(name, keys):
    """The model's head-weight scale (128^-0.5 * 64^-0.5) multiplied in the kernel gives the bits of
    the weights multiplied by torch beforehand (the model's path until session 13)."""
    q, w, k_pool, key_rows, n_visible = _case(name)
    fmt = None if keys == "bf16" else FP4
    pool = k_pool if fmt is None else pack_rows(k_pool, FP4)
    scale = 128**-0.5 * 64**-0.5
    got = index_scores(q, w, pool, key_rows, n_visible, row_format=fmt, weight_scale=scale)
    want = index_scores(q, w * scale, pool, key_rows, n_visible, row_format=fmt)
    assert torch.isfinite(want).any() and torch.equal(got, want)
