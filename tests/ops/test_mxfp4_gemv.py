"""MXFP4 GEMV kernel (ops/mxfp4_gemv_triton.py) against a per-pick loop over weights decoded nibble
by nibble from the format's definition (test_mxfp4_grouped_matmul.py's oracle): 1, 2 and 4 picks
a program, empty experts, experts with more picks than a program holds, picks past the last
group, the fused SwiGLU against its formula, the word decoders on every code. Interpreted at tiny
tiles on the CPU; on the GPU at Flash shapes (c1 / c8 / c64) and bit for bit on every code and
scale byte."""

import pytest
import torch
from test_mxfp4_grouped_matmul import _case, _naive, _naive_weight, _swiglu

from v4serve.ops.mxfp4_gemv_triton import gemv_picks, mxfp4_gemv_triton
from v4serve.ops.mxfp4_grouped_matmul import mxfp4_grouped_matmul

TINY = dict(BLOCK_N=16, BLOCK_K=64, num_warps=1, num_stages=1)  # interpreter time


def _close(got, want, dtype=torch.float32):
    # exact products, fp32 sums in another order, one rounding to the output dtype
    rtol = 1e-5 if dtype == torch.float32 else 2**-8
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("picks", [1, 2, 4])
@pytest.mark.parametrize("sizes, n, k", [([1, 0, 5, 1], 32, 96), ([0, 3, 0], 20, 160)])
def test_matches_a_loop_over_picks(picks, sizes, n, k):
    # 5 picks on one expert: 5, 3 or 2 programs of that expert (K 96: a partial last step)
    x, weight, scale, rows, ends = _case(sizes, n, k)
    got = mxfp4_gemv_triton(x, weight, scale, rows, ends, sum(sizes), picks, TINY)
    _close(got, _naive(x, weight, scale, rows, ends))


@pytest.mark.parametrize("picks", [1, 2])
def test_fused_swiglu_matches_the_formula(picks):
    sizes = [3, 0, 1]
    x, weight, scale, rows, ends = _case(sizes, 80, 64)
    got = mxfp4_gemv_triton(x, weight, scale, rows, ends, sum(sizes), picks, TINY, swiglu_limit=0.75)
    proj = _naive(x, weight, scale, rows, ends)
    assert (proj.abs() > 0.75).any()  # the clamps are exercised
    assert got.shape == (sum(sizes), 40)  # 40 outputs: not a multiple of BLOCK_N
    _close(got, _swiglu(proj[:, :40], proj[:, 40:], 0.75))


def test_bf16_without_rows_and_picks_past_the_groups():
    # 7 picks, groups end at 5: picks 5 and 6 belong to no group and are left alone
    x, weight, scale, _, ends = _case([2, 3], 32, 64, t=7, dtype=torch.bfloat16)
    y = mxfp4_gemv_triton(x, weight, scale, None, ends, 7, 1, TINY)
    assert y.dtype == torch.bfloat16
    _close(y[:5], _naive(x, weight, scale, torch.arange(5), ends), torch.bfloat16)


def test_word_decoder_on_every_code_and_scale_byte():
    # Every byte (4 rows of 64 bytes hold all 256) with scale byte b (b = 0: the subnormal scale;
    # up to 252: finite; b in steps of 36 for interpreter time), x one-hot: y is W^T element for
    # element, exactly.
    scales = torch.arange(0, 253, 36, dtype=torch.int32).repeat_interleave(4)
    weight = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(4, 64).repeat(len(scales) // 4, 1)[None]
    scale = scales.to(torch.uint8)[:, None].expand(len(scales), 4).contiguous()[None]
    got = mxfp4_gemv_triton(torch.eye(128), weight, scale, None, torch.tensor([128], dtype=torch.int32), 128, 4,
                            dict(TINY, BLOCK_N=32, BLOCK_K=128))
    assert torch.equal(got, _naive_weight(weight[0], scale[0]).T.float())


def test_the_choice_follows_the_expected_picks_per_expert():
    # up to 0.75 E picks: decode and speculative verify batches up to 32 tokens at top-6 of 256
    assert [gemv_picks(6 * c, 256) for c in (1, 8, 16, 32, 33, 64, 2048)] == [1, 1, 1, 1, None, None, None]
    assert gemv_picks(512, 1) is None  # one expert with every pick: the tensor-core kernel


def test_the_dispatch_takes_the_gemv_at_decode_sizes():
    # through the public op (GEMV: 9 picks over 4 experts) and with the layer's expert count
    # given (tile_experts 256: still the GEMV, as an ExpertOffload pass calls it)
    x, weight, scale, rows, ends = _case([3, 0, 5, 1], 48, 64)
    want = _naive(x, weight, scale, rows, ends)
    _close(mxfp4_grouped_matmul(x, weight, scale, rows, ends, impl="triton"), want)
    _close(mxfp4_grouped_matmul(x, weight, scale, rows, ends, impl="triton", tile_experts=256), want)


# ---- GPU, full shapes ----
_FLASH = [("gate_up", 256, 4096, 4096), ("down", 256, 4096, 2048)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("decode", ["asm", "bits"])
def test_gpu_every_code_and_scale_byte_bit_for_bit(decode):
    n_scales = 253
    weight = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(n_scales, 1)[None].cuda()
    scale = torch.arange(n_scales, dtype=torch.int32).to(torch.uint8)[:, None].expand(n_scales, 16).contiguous()[None].cuda()
    ends = torch.tensor([512], dtype=torch.int32, device="cuda")
    want = _naive_weight(weight[0].cpu(), scale[0].cpu()).T
    for picks in (1, 2, 4):
        got = mxfp4_gemv_triton(torch.eye(512, device="cuda").bfloat16(), weight, scale, None, ends, 512, picks,
                                decode=decode)
        # equal values: a -0 weight times 1 summed with +0 products is +0, as IEEE says
        assert torch.equal(got.cpu().float(), want.bfloat16().float())
        got = mxfp4_gemv_triton(torch.eye(512, device="cuda"), weight, scale, None, ends, 512, picks, decode=decode)
        assert torch.equal(got.cpu(), want.float())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1, 8, 64])
@pytest.mark.parametrize("decode", ["asm", "bits"])
@pytest.mark.parametrize("name, e, n, k", _FLASH, ids=[c[0] for c in _FLASH])
def test_gpu_flash_shapes_against_the_reference(name, e, n, k, decode, tokens):
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    weight = torch.randint(0, 256, (e, n, k // 2), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    scale = torch.randint(118, 124, (e, n, k // 32), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    x = torch.randn(tokens, k, generator=gen, device="cuda").bfloat16()
    experts = torch.rand(tokens, e, generator=gen, device="cuda").topk(6, 1).indices
    experts[-1] = experts[0]  # c > 1: some experts with 2 picks
    rows = experts.flatten().argsort(stable=True) // 6
    ends = torch.bincount(experts.flatten(), minlength=e).cumsum(0).to(torch.int32)
    want = mxfp4_grouped_matmul(x, weight, scale, rows, ends, impl="torch").float()
    for picks in (1, 2, 4):
        got = mxfp4_gemv_triton(x, weight, scale, rows, ends, rows.shape[0], picks, decode=decode).float()
        torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-4 * want.abs().max().item())
        if name == "gate_up":  # the SwiGLU epilogue: the formula on the reference projection
            limit = 0.5 * want.abs().max().item()
            fused = mxfp4_gemv_triton(x, weight, scale, rows, ends, rows.shape[0], picks, swiglu_limit=limit,
                                      decode=decode).double()
            ref = _swiglu(want[:, :n // 2].double(), want[:, n // 2:].double(), limit)
            torch.testing.assert_close(fused, ref, rtol=2**-5, atol=1e-3 * ref.abs().max().item())
