"""MXFP4 grouped matmul: the torch reference and the Triton kernel (interpreted on the CPU)
against a per-pick loop over weights decoded nibble by nibble, with empty groups, uneven group
sizes and K, N not multiples of the tiles; the fused SwiGLU epilogue against the SwiGLU formula
applied to that loop's output. On the GPU, both weight decoders (the PTX block and the integer
one) bit for bit on every code and scale, and the model shapes."""

import math

import pytest
import torch

from v4serve.ops.mxfp4_grouped_matmul import mxfp4_grouped_matmul

_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _case(sizes, n, k, t=9, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=gen).to(dtype)
    weight = torch.randint(0, 256, (len(sizes), n, k // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    scale = torch.randint(118, 130, (len(sizes), n, k // 32), generator=gen, dtype=torch.int32).to(torch.uint8)
    rows = torch.randint(0, t, (sum(sizes),), generator=gen)
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
    return x, weight, scale, rows, ends


def _naive_weight(packed, scale):
    n, half = packed.shape
    w = torch.empty(n, 2 * half, dtype=torch.float64)
    for i in range(n):
        for j in range(2 * half):
            byte = int(packed[i, j // 2])
            code = byte & 0xF if j % 2 == 0 else byte >> 4
            v = _E2M1[code & 7] * (-1 if code & 8 else 1)
            w[i, j] = math.ldexp(v, int(scale[i, j // 32]) - 127)
    return w


def _naive(x, weight, scale, rows, ends):
    group = torch.searchsorted(ends.long(), torch.arange(rows.shape[0]), right=True)
    cache = {}
    out = []
    for g, r in zip(group.tolist(), rows.tolist()):
        if g not in cache:
            cache[g] = _naive_weight(weight[g], scale[g])
        out.append(cache[g] @ x[r].double())
    return torch.stack(out) if out else torch.zeros(0, weight.shape[1], dtype=torch.float64)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("sizes, n, k", [([3, 0, 5, 1], 48, 64), ([0, 17, 0, 2, 40], 80, 96), ([1], 16, 32), ([0, 0, 33], 20, 160), ([3, 0, 5, 1], 48, 256)])
def test_matches_a_loop_over_picks(impl, sizes, n, k):
    x, weight, scale, rows, ends = _case(sizes, n, k)
    got = mxfp4_grouped_matmul(x, weight, scale, rows, ends, impl=impl)
    want = _naive(x, weight, scale, rows, ends)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_bf16_without_rows(impl):
    sizes = [3, 0, 5, 1, 20]
    x, weight, scale, _, ends = _case(sizes, 48, 64, t=sum(sizes), dtype=torch.bfloat16)
    got = mxfp4_grouped_matmul(x, weight, scale, None, ends, impl=impl)
    assert got.dtype == torch.bfloat16
    want = _naive(x, weight, scale, torch.arange(sum(sizes)), ends)
    # fp32 accumulation of exact products, one rounding to bf16: within one bf16 ulp.
    torch.testing.assert_close(got.double(), want, rtol=2**-8, atol=1e-6 * want.abs().max().item())


def test_bad_arguments_are_named():
    x, weight, scale, rows, ends = _case([2, 2], 16, 64)
    with pytest.raises(ValueError, match="ends must be int32"):
        mxfp4_grouped_matmul(x, weight, scale, rows, ends.long())
    with pytest.raises(ValueError, match="scale must be"):
        mxfp4_grouped_matmul(x, weight, scale[..., :1], rows, ends)
    with pytest.raises(ValueError, match="weight"):
        mxfp4_grouped_matmul(x[:, :32], weight, scale, rows, ends)


def test_kernel_decodes_every_code_with_every_finite_scale_exactly():
    # Row b of expert 0 holds all 256 bytes (every code pair) with scale byte b; x = identity, so
    # y = W^T element for element (fp32 dot of one-hot rows: exact). b <= 252: 6 * 2^(b-127) is finite.
    n_scales = 253
    weight = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(n_scales, 1)[None]
    scale = torch.arange(n_scales, dtype=torch.int32).to(torch.uint8)[:, None].expand(n_scales, 16).contiguous()[None]
    x = torch.eye(512)
    got = mxfp4_grouped_matmul(x, weight, scale, None, torch.tensor([512], dtype=torch.int32), impl="triton")
    want = _naive_weight(weight[0], scale[0]).T.float()
    assert torch.equal(got, want)


@pytest.mark.parametrize("k", [160, 256])  # scale bytes; scale words (K % 128 == 0)
def test_prefill_tiles_match_the_reference(k):
    from v4serve.ops.mxfp4_grouped_matmul_triton import MXFP4_PREFILL_CONFIG, mxfp4_grouped_matmul_triton

    sizes = [70, 0, 5, 130]
    x, weight, scale, rows, ends = _case(sizes, 136, k, t=40, dtype=torch.bfloat16)
    got = mxfp4_grouped_matmul_triton(x, weight, scale, rows, ends, sum(sizes), MXFP4_PREFILL_CONFIG)
    want = _naive(x, weight, scale, rows, ends)
    torch.testing.assert_close(got.double(), want, rtol=2**-8, atol=1e-6 * want.abs().max().item())


def _swiglu(gate, up, limit):
    """The experts' clamped SwiGLU, from its formula (not the op under test), in float64."""
    g = gate.clamp(max=limit)
    return g / (1 + torch.exp(-g)) * up.clamp(-limit, limit)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_fused_swiglu_matches_the_formula(impl):
    # N = 2 x 40 rows: gate rows 0..39, up rows 40..79 (40 is not a multiple of the tiles)
    sizes = [3, 0, 5, 1]
    x, weight, scale, rows, ends = _case(sizes, 80, 96)
    got = mxfp4_grouped_matmul(x, weight, scale, rows, ends, impl=impl, swiglu_limit=0.75)
    proj = _naive(x, weight, scale, rows, ends)
    want = _swiglu(proj[:, :40], proj[:, 40:], 0.75)
    assert got.shape == (sum(sizes), 40)
    assert (proj.abs() > 0.75).any()  # the clamps are exercised
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_fused_swiglu_with_the_prefill_tiles():
    from v4serve.ops.mxfp4_grouped_matmul_triton import MXFP4_PREFILL_SWIGLU_CONFIG, mxfp4_grouped_matmul_triton

    sizes = [70, 0, 5]
    x, weight, scale, rows, ends = _case(sizes, 80, 128, t=30, dtype=torch.bfloat16)
    got = mxfp4_grouped_matmul_triton(x, weight, scale, rows, ends, sum(sizes), MXFP4_PREFILL_SWIGLU_CONFIG, 0.75)
    proj = _naive(x, weight, scale, rows, ends)
    want = _swiglu(proj[:, :40], proj[:, 40:], 0.75)
    # gate and up rounded to bf16 before the SwiGLU, whose steps round to bf16 too
    torch.testing.assert_close(got.double(), want, rtol=2**-6, atol=1e-2 * want.abs().max().item())


def test_fused_swiglu_needs_gate_and_up_halves():
    x, weight, scale, rows, ends = _case([2, 2], 15, 64)
    with pytest.raises(ValueError, match="even N"):
        mxfp4_grouped_matmul(x, weight, scale, rows, ends, swiglu_limit=1.0)


@pytest.mark.parametrize("sizes", [[0] * 30 + [4] + [0] * 9, [1, 0, 1, 0, 1] + [0] * 35, [0] * 39 + [20]])
def test_few_picks_over_many_experts(sizes):
    # The grid has cdiv(M, BLOCK_M) + min(E, M) blocks of picks, far fewer than E: every pick must
    # still be computed (one expert with every pick, picks on the last expert, scattered ones).
    x, weight, scale, rows, ends = _case(sizes, 24, 64)
    got = mxfp4_grouped_matmul(x, weight, scale, rows, ends, impl="triton")
    want = _naive(x, weight, scale, rows, ends)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("w_as_a", [False, True])
@pytest.mark.parametrize("swiglu", [None, 0.75])
def test_wide_k_steps_with_a_partial_last_word(w_as_a, swiglu):
    # BLOCK_K 256 over K = 384: the second step's second scale word lies past K and is masked;
    # with W_AS_A the weights are the dot's first operand (the accumulator transposed).
    from v4serve.ops.mxfp4_grouped_matmul_triton import mxfp4_grouped_matmul_triton

    sizes = [2, 3]
    x, weight, scale, rows, ends = _case(sizes, 32, 384)
    cfg = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=256, num_warps=4, num_stages=2, W_AS_A=w_as_a)
    got = mxfp4_grouped_matmul_triton(x, weight, scale, rows, ends, sum(sizes), cfg, swiglu)
    want = _naive(x, weight, scale, rows, ends)
    if swiglu is not None:
        want = _swiglu(want[:, :16], want[:, 16:], swiglu)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


def test_the_ptx_decoder_is_refused_for_other_dtypes():
    from v4serve.ops.mxfp4_grouped_matmul_triton import MXFP4_DECODE_CONFIG, mxfp4_grouped_matmul_triton

    x, weight, scale, rows, ends = _case([2], 16, 64)
    with pytest.raises(ValueError, match="DECODE"):
        mxfp4_grouped_matmul_triton(x, weight, scale, rows, ends, 2, dict(MXFP4_DECODE_CONFIG, DECODE="asm"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decode", ["asm", "bits"])
@pytest.mark.parametrize("cfg", ["decode", "decode weights as A", "prefill"])
def test_kernel_decodes_every_code_on_gpu_bit_for_bit(decode, cfg):
    from v4serve.ops.mxfp4_grouped_matmul_triton import (MXFP4_DECODE_CONFIG, MXFP4_PREFILL_CONFIG,
                                                         mxfp4_grouped_matmul_triton)

    # Row b holds all 256 bytes (every code pair, every sign) with scale byte b (b = 0: subnormal
    # scale; b <= 252 keeps 6 * 2^(b-127) finite); x = identity, so y = W^T element for element.
    n_scales = 253
    weight = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(n_scales, 1)[None].cuda()
    scale = torch.arange(n_scales, dtype=torch.int32).to(torch.uint8)[:, None].expand(n_scales, 16).contiguous()[None].cuda()
    ends = torch.tensor([512], dtype=torch.int32, device="cuda")
    want = _naive_weight(weight[0].cpu(), scale[0].cpu()).T
    tiles = dict(MXFP4_PREFILL_CONFIG if cfg == "prefill" else MXFP4_DECODE_CONFIG, DECODE=decode,
                 W_AS_A=cfg.endswith("as A"))
    eye = torch.eye(512, device="cuda").bfloat16()
    got = mxfp4_grouped_matmul_triton(eye, weight, scale, None, ends, 512, tiles)
    # Equal values (so equal bits for every non-zero): a -0 weight's product (-0 x 1) is summed
    # with the row's +0 products (0 x a positive weight), so the dot gives +0 for it, as IEEE says.
    assert torch.equal(got.cpu().float(), want.bfloat16().float())
    if decode == "bits":  # fp32 activations: fp32 weights, IEEE dot
        got = mxfp4_grouped_matmul_triton(eye.float(), weight, scale, None, ends, 512, tiles)
        assert torch.equal(got.cpu(), want.float())


# (experts, N, K) of the fused gate_up ([E, 2I, D]) and down ([E, D, I]) projections
_MOE_GPU = [("flash gate_up", 256, 4096, 4096), ("flash down", 256, 4096, 2048),
            ("pro gate_up", 384, 6144, 7168), ("pro down", 384, 7168, 3072)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens, decode", [(1, "asm"), (8, "asm"), (64, "asm"), (2048, "asm"), (1, "bits"),
                                            (2048, "bits")])
@pytest.mark.parametrize("name, e, n, k", _MOE_GPU, ids=[c[0] for c in _MOE_GPU])
def test_triton_on_gpu_at_model_shapes(name, e, n, k, tokens, decode):
    from v4serve.ops.mxfp4_grouped_matmul_triton import mxfp4_config, mxfp4_grouped_matmul_triton

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    weight = torch.randint(0, 256, (e, n, k // 2), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    scale = torch.randint(118, 124, (e, n, k // 32), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    x = torch.randn(tokens, k, generator=gen, device="cuda").bfloat16()
    experts = torch.rand(tokens, e, generator=gen, device="cuda").topk(6, 1).indices
    order = experts.flatten().argsort(stable=True)
    rows = order // 6
    ends = torch.bincount(experts.flatten(), minlength=e).cumsum(0).to(torch.int32)
    want = mxfp4_grouped_matmul(x, weight, scale, rows, ends, impl="torch").float()
    tiles = dict(mxfp4_config(rows.shape[0], e), DECODE=decode)
    got = mxfp4_grouped_matmul_triton(x, weight, scale, rows, ends, rows.shape[0], tiles).float()
    # exact products (bf16 x, e2m1 * 2^k exact in bf16), fp32 sums in another order: one bf16 ulp
    # plus the fp32 rounding of the sums where they cancel.
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-4 * want.abs().max().item())
    if "gate_up" in name:  # the SwiGLU epilogue: the formula on the reference projection
        limit = 0.5 * want.abs().max().item()  # clamps some
        fused = mxfp4_grouped_matmul(x, weight, scale, rows, ends, impl="triton", swiglu_limit=limit).float()
        half = n // 2
        ref = _swiglu(want[:, :half].double(), want[:, half:].double(), limit)
        # gate and up within a bf16 ulp or two of the reference's, then bf16 roundings in the SwiGLU
        torch.testing.assert_close(fused.double(), ref, rtol=2**-5, atol=1e-3 * ref.abs().max().item())
