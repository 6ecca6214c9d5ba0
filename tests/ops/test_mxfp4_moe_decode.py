"""The sort-free decode path of the MXFP4 experts (ops/mxfp4_moe_decode*.py) against the sorted path
it replaces (moe_sort, the one-pick GEMV twice, moe_combine: production before it), bit for bit:
with and without the shared expert's add, with the combine in the down launch (counters left at
zero), repeated experts within a token and across tokens, several column tiles. Interpreted on the
CPU at small shapes with production's tiles; on the GPU at Flash shapes (c1, c8, the verify sizes)."""

import pytest
import torch

from v4serve.ops.moe_combine import moe_combine
from v4serve.ops.moe_route import moe_route
from v4serve.ops.moe_sort import moe_sort
from v4serve.ops.mxfp4_gemv_triton import gemv_config, mxfp4_gemv_triton
from v4serve.ops.mxfp4_moe_decode import (combine_counters_size, direct_applies, mxfp4_experts,
                                          mxfp4_experts_pass, sorted_experts)
from v4serve.ops.mxfp4_moe_decode_triton import combine_tiles, mxfp4_moe_pick_triton


def _layer(e, d, i, t, k, seed=0, dtype=torch.bfloat16, device="cpu"):
    gen = torch.Generator(device=device).manual_seed(seed)

    def packed(rows, cols):
        w = torch.randint(0, 256, (e, rows, cols // 2), generator=gen, device=device, dtype=torch.int32)
        s = torch.randint(118, 124, (e, rows, cols // 32), generator=gen, device=device, dtype=torch.int32)
        return w.to(torch.uint8), s.to(torch.uint8)

    x = torch.randn(t, d, generator=gen, device=device).to(dtype)
    experts = torch.rand(t, e, generator=gen, device=device).topk(k, 1).indices
    weights = torch.rand(t, k, generator=gen, device=device)
    add = torch.randn(t, d, generator=gen, device=device).to(dtype)
    return x, experts, weights, add, (*packed(2 * i, d), *packed(d, i))


@pytest.mark.parametrize("with_add", [False, True])
@pytest.mark.parametrize("in_down", [False, True])
def test_sort_free_path_has_the_sorted_paths_bits(with_add, in_down):
    # 8 experts, top-2, 3 tokens: 6 picks = 0.75 E (the largest batch the GEMV takes); token 2
    # repeats one expert (hash tables can), token 1 shares one with token 0. D 128 = 2 down tiles.
    x, experts, weights, add, tensors = _layer(e=8, d=128, i=64, t=3, k=2)
    experts[2] = experts[2, 0]
    experts[1, 1] = experts[0, 0]
    add = add if with_add else None
    assert direct_applies("triton", x, experts, tensors)
    want = sorted_experts(x, experts, weights, tensors, 0.75, add, impl="triton")
    arrivals = torch.zeros(combine_counters_size(8, 2, 128), dtype=torch.int32)
    got = mxfp4_experts(x, experts, weights, tensors, 0.75, add, impl="triton", arrivals=arrivals,
                        combine_in_down=in_down)
    assert torch.equal(got, want)
    assert not arrivals.any()  # the tickets are left at zero for the next launch
    ref = sorted_experts(x, experts, weights, tensors, 0.75, add, impl="torch")  # fp32 sums in another order
    torch.testing.assert_close(got.float(), ref.float(), rtol=2**-7, atol=1e-2 * ref.abs().max().item())


@pytest.mark.parametrize("ahead", [1, 2])
def test_bench_variants_keep_the_bits(ahead):
    # the sweep's variants move loads only (AHEAD steps in flight, the down weights before the PDL
    # wait): the same bits; K 160 / 96: steps past K masked (not EVEN_K), several steps
    x, experts, weights, add, tensors = _layer(e=8, d=160, i=96, t=1, k=2, seed=2)
    configs = (dict(gemv_config(1, True), BLOCK_K=64, AHEAD=ahead),
               dict(gemv_config(1, False), BLOCK_K=64, AHEAD=ahead, EARLY=True))
    sorted_tiles = [dict(c, PICKS=1) for c in configs]
    rows, ends, pos = moe_sort(experts, 8)
    hidden = mxfp4_gemv_triton(x, tensors[0], tensors[1], rows, ends, 2, 1, sorted_tiles[0], swiglu_limit=0.75)
    y = mxfp4_gemv_triton(hidden, tensors[2], tensors[3], None, ends, 2, 1, sorted_tiles[1])
    want = moe_combine(y, pos, weights, add)
    arrivals = torch.zeros(64, dtype=torch.int32)
    for in_down in (False, True):
        got = mxfp4_experts(x, experts, weights, tensors, 0.75, add, impl="triton", arrivals=arrivals,
                            combine_in_down=in_down, configs=configs)
        assert torch.equal(got, want)


def test_counters_count_every_token_tile():
    # 3 tokens x 2 tiles of 64 columns; twice in a row: the second call finds the counters at zero
    x, experts, weights, add, tensors = _layer(e=8, d=128, i=64, t=3, k=2, seed=1)
    assert combine_tiles(128) == 2 and combine_counters_size(8, 2, 128) >= 6
    arrivals = torch.zeros(6, dtype=torch.int32)
    first = mxfp4_experts(x, experts, weights, tensors, 0.75, add, impl="triton", arrivals=arrivals,
                          combine_in_down=True)
    again = mxfp4_experts(x, experts, weights, tensors, 0.75, add, impl="triton", arrivals=arrivals,
                          combine_in_down=True)
    assert torch.equal(first, again) and not arrivals.any()


def test_larger_batches_take_the_sorted_path():
    # 8 picks over 8 experts (> 0.75 E): the tensor-core kernel's batches keep the sort
    x, experts, weights, add, tensors = _layer(e=8, d=64, i=32, t=4, k=2, dtype=torch.float32)
    assert not direct_applies("triton", x, experts, tensors)
    got = mxfp4_experts(x, experts, weights, tensors, 0.75, add, impl="torch")
    assert torch.equal(got, sorted_experts(x, experts, weights, tensors, 0.75, add, impl="torch"))


def test_skipped_picks_keep_their_rows():
    # picks 1 and 4 carry id E (= 8, past the weight's rows): their rows of h and y keep the
    # sentinel, the others have the unskipped launch's bits (D 128: two down tiles)
    x, experts, _, _, (w13, s13, w2, s2) = _layer(e=8, d=128, i=64, t=3, k=2, seed=3)
    flat = experts.reshape(-1).contiguous()
    skipped = torch.tensor([False, True, False, False, True, False])
    groups = torch.where(skipped, 8, flat)
    sentinel = -7.0
    hidden = torch.full((6, 64), sentinel, dtype=x.dtype)
    mxfp4_moe_pick_triton(x, w13, s13, groups, 2, True, swiglu_limit=0.75, y=hidden, skip_past_rows=True)
    full_hidden = mxfp4_moe_pick_triton(x, w13, s13, flat, 2, True, swiglu_limit=0.75)
    assert (hidden[skipped] == sentinel).all()
    assert torch.equal(hidden[~skipped], full_hidden[~skipped])
    y = torch.full((6, 128), sentinel, dtype=x.dtype)
    got = mxfp4_moe_pick_triton(full_hidden, w2, s2, groups, 2, False, y=y, skip_past_rows=True)
    assert got.data_ptr() == y.data_ptr() and (y[skipped] == sentinel).all()
    assert torch.equal(y[~skipped], mxfp4_moe_pick_triton(full_hidden, w2, s2, flat, 2, False)[~skipped])


def test_passes_over_split_picks_give_the_layers_bits():
    # an offloaded layer's schedule over one weight tensor: pass A computes the picks of experts
    # 0..3, pass B the rest (each pass's other picks carry id E), into the same hidden and y; one
    # combine after both = the one-launch layer, bit for bit, and near the torch reference
    x, experts, weights, add, tensors = _layer(e=8, d=128, i=64, t=3, k=2, seed=4)
    experts[1, 1] = experts[0, 0]
    in_a = experts < 4
    outputs = mxfp4_experts_pass(x, torch.where(in_a, experts, 8), tensors, 0.75)
    hidden, y = mxfp4_experts_pass(x, torch.where(in_a, 8, experts), tensors, 0.75, outputs)
    assert hidden.data_ptr() == outputs[0].data_ptr() and y.data_ptr() == outputs[1].data_ptr()
    got = moe_combine(y, None, weights, add)
    assert torch.equal(got, mxfp4_experts(x, experts, weights, tensors, 0.75, add, impl="triton"))
    ref = sorted_experts(x, experts, weights, tensors, 0.75, add, impl="torch")
    torch.testing.assert_close(got.float(), ref.float(), rtol=2**-7, atol=1e-2 * ref.abs().max().item())


# ---- GPU, Flash shapes ----
def _sorted_gemv(x, experts, weights, tensors, add, decode):
    """The sorted path at decode sizes with the given word decoder (production: "asm")."""
    w13, s13, w2, s2 = tensors
    rows, ends, pos = moe_sort(experts, w13.shape[0])
    hidden = mxfp4_gemv_triton(x, w13, s13, rows, ends, rows.shape[0], 1, swiglu_limit=10.0, decode=decode)
    y = mxfp4_gemv_triton(hidden, w2, s2, None, ends, rows.shape[0], 1, decode=decode)
    return moe_combine(y, pos, weights, add)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1, 8, 16, 32])
@pytest.mark.parametrize("decode", ["asm", "bits"])
def test_gpu_flash_sort_free_path_has_the_sorted_paths_bits(tokens, decode):
    # the routed layer as the model runs it: router top-6 of 256, the shared expert's output added
    x, _, _, add, tensors = _layer(e=256, d=4096, i=2048, t=tokens, k=6, seed=tokens, device="cuda")
    logits = torch.randn(tokens, 256, device="cuda").bfloat16()
    experts, weights = moe_route(logits, 6, "sqrtsoftplus", True, 1.5, bias=torch.zeros(256, device="cuda"))
    if tokens > 1:
        experts[-1] = experts[0]  # some experts with 2 picks
    want = _sorted_gemv(x, experts, weights, tensors, add, decode)
    if decode == "asm":
        assert torch.equal(want, sorted_experts(x, experts, weights, tensors, 10.0, add))  # = production's
    arrivals = torch.zeros(combine_counters_size(256, 6, 4096), dtype=torch.int32, device="cuda")
    for in_down in (False, True):
        for _ in range(2):  # the second call finds the counters the first left
            got = mxfp4_experts(x, experts, weights, tensors, 10.0, add, arrivals=arrivals, combine_in_down=in_down,
                                decode=decode)
            assert torch.equal(got, want)
            assert not arrivals.any()
