"""FP8 GEMV (ops/fp8_gemv_triton.py): the word decoder against torch's e4m3 cast for every byte,
and the kernel (interpreted on the CPU at tiny shapes, compiled on the GPU at model shapes)
against the torch reference (fp8_linear_reference.py) and the production tensor-core kernel."""

import pytest
import torch
import triton
import triton.language as tl

from v4serve.ops.fp8_gemv_triton import e4m3_word_asm, e4m3_word_bits, fp8_gemv_triton
from v4serve.ops.fp8_linear import fp8_linear
from v4serve.ops.weight_formats import quantize_fp8_blocks


@triton.jit
def _decode_words_kernel(words_ptr, out_ptr, n, ASM: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    words = tl.load(words_ptr + offs, mask=offs < n, other=0)
    if ASM:
        v0, v1, v2, v3 = e4m3_word_asm(words)
    else:
        v0, v1, v2, v3 = e4m3_word_bits(words)
    tl.store(out_ptr + 4 * offs, v0, mask=offs < n)
    tl.store(out_ptr + 4 * offs + 1, v1, mask=offs < n)
    tl.store(out_ptr + 4 * offs + 2, v2, mask=offs < n)
    tl.store(out_ptr + 4 * offs + 3, v3, mask=offs < n)


def _check_decoder_on_every_byte(device, asm):
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # e4m3fn NaNs are not weights
    codes = torch.cat([codes, codes.new_zeros(256 - codes.numel())]).to(device)  # 64 whole words
    out = torch.empty(256, dtype=torch.float32, device=device)
    _decode_words_kernel[(1,)](codes.view(torch.int32), out, 64, ASM=asm, BLOCK=64)
    want = codes.view(torch.float8_e4m3fn).float()
    assert torch.equal(out.view(torch.int32), want.view(torch.int32))  # -0 included


def test_integer_decoder_matches_the_e4m3_cast_on_every_byte():
    _check_decoder_on_every_byte("cpu", asm=False)


def _weights(n, k, block, scale_fmt="ue8m0", seed=0, device="cpu"):
    gen = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(n, k, generator=gen, device=device) * torch.logspace(-2, 1, n, device=device)[:, None]
    return quantize_fp8_blocks(w, block, scale_fmt)


# m, n, k, block, act_block, scale_fmt, split_k (None: the wrapper's choice)
_CASES = [
    (1, 80, 96, (32, 32), 32, "ue8m0", None),     # V4.1 numerics, partial N tile, K not a whole BLOCK_K
    (3, 70, 256, (128, 128), 128, "ue8m0", 2),    # V4 numerics, two K splits summed in order
    (8, 40, 400, (128, 128), 128, "fp32", 3),     # 8 rows, fp32 weight scales, uneven splits
    (2, 48, 160, (32, 32), None, "ue8m0", None),  # weight-only, scale per 32 x 32 block
    (5, 33, 144, (128, 128), 32, "ue8m0", None),  # act groups (32) finer than weight blocks (128)
]


@pytest.mark.parametrize("m, n, k, block, act_block, scale_fmt, split_k", _CASES)
def test_gemv_matches_the_reference(m, n, k, block, act_block, scale_fmt, split_k):
    weight, scale = _weights(n, k, block, scale_fmt, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k))
    # fp32 activations: the only difference from the reference is the fp32 summation order
    want = fp8_linear(x, weight, scale, block, act_block=act_block, impl="torch")
    got = fp8_gemv_triton(x, weight, scale, block, act_block, split_k=split_k, cvt="bits")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())
    # bf16 activations: y rounded to bf16 once (at most one bf16 rounding step apart)
    xb = x.bfloat16()
    want_b = fp8_linear(xb, weight, scale, block, act_block=act_block, impl="torch").float()
    got_b = fp8_gemv_triton(xb, weight, scale, block, act_block, split_k=split_k, cvt="bits")
    assert got_b.dtype == torch.bfloat16
    torch.testing.assert_close(got_b.float(), want_b, rtol=2**-7, atol=1e-6 * want_b.abs().max().item())


@pytest.mark.parametrize("k", [384, 400])  # whole K steps (prefetches clamped to the split) or a partial last step
def test_prefetch_depth_and_x_ahead_change_no_bit_and_wide_steps_agree(k):
    from v4serve.ops.fp8_gemv_triton import GEMV_CONFIG

    weight, scale = _weights(40, k, (128, 128), seed=k)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(5))
    want = fp8_linear(x, weight, scale, act_block=128, impl="torch")
    outs = [fp8_gemv_triton(x, weight, scale, (128, 128), 128, config=dict(GEMV_CONFIG, PREFETCH=p, X_AHEAD=ahead),
                            split_k=2, cvt="bits") for p in (1, 2) for ahead in (True, False)]
    assert all(torch.equal(outs[0], out) for out in outs[1:])  # where the loads sit changes no bit
    torch.testing.assert_close(outs[1], want, rtol=1e-5, atol=1e-6 * want.abs().max().item())
    # the sweep's 256-byte K steps: other accumulator columns, so only the fp32 order differs
    wide = fp8_gemv_triton(x, weight, scale, (128, 128), 128, config=dict(GEMV_CONFIG, BLOCK_N=32, BLOCK_K=256,
                                                                          PREFETCH=1), split_k=2, cvt="bits")
    torch.testing.assert_close(wide, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())


def test_gemv_reads_strided_rows_of_x():
    weight, scale = _weights(24, 64, (32, 32))
    wide = torch.randn(3, 100, generator=torch.Generator().manual_seed(1))
    x = wide[:, 16:80]  # row stride 100, unit column stride
    for act_block in (None, 32):
        want = fp8_linear(x.contiguous(), weight, scale, (32, 32), act_block=act_block, impl="torch")
        got = fp8_gemv_triton(x, weight, scale, (32, 32), act_block, cvt="bits")
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())


def test_dispatch_selects_the_gemv_and_keeps_leading_dims():
    weight, scale = _weights(20, 48, (16, 16))
    x = torch.randn(2, 3, 48, generator=torch.Generator().manual_seed(3))
    got = fp8_linear(x, weight, scale, (16, 16), act_block=16, impl="triton", kernel="gemv")
    want = fp8_linear(x, weight, scale, (16, 16), act_block=16, impl="torch")
    assert got.shape == (2, 3, 20)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6 * want.abs().max().item())


def test_gemv_refuses_what_it_cannot_run():
    weight, scale = _weights(16, 64, (32, 32))
    with pytest.raises(ValueError, match="1..8 rows"):
        fp8_gemv_triton(torch.randn(9, 64), weight, scale, (32, 32), 32)
    with pytest.raises(ValueError, match="at least 16"):
        fp8_gemv_triton(torch.randn(1, 64), weight, scale, (32, 32), 8)
    with pytest.raises(ValueError, match="kernel must be one of"):
        fp8_linear(torch.randn(1, 64), weight, scale, (32, 32), kernel="tensor")


# ---- GPU: model shapes, against the reference and the production (tensor-core) kernel ----
_FLASH = {"wq_a": (1024, 4096), "wq_b": (32768, 1024), "wkv": (512, 4096), "wo_b": (4096, 8192),
          "shared_w1": (2048, 4096), "shared_w2": (4096, 2048)}
_PRO = {"wq_a": (1536, 7168), "wq_b": (65536, 1536), "wo_b": (7168, 16384)}
_GPU_SHAPES = [(f"flash {p}", *nk) for p, nk in _FLASH.items()] + [(f"pro {p}", *nk) for p, nk in _PRO.items()]


def _gpu_case(n, k, m, block, scale_fmt, seed):
    weight, scale = _weights(n, k, block, scale_fmt, seed=seed, device="cuda")
    x = torch.randn(m, k, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda").bfloat16()
    return x, weight, scale


@pytest.mark.gpu
def test_asm_decoder_matches_the_e4m3_cast_on_every_byte_on_gpu():
    _check_decoder_on_every_byte("cuda", asm=True)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 8])
@pytest.mark.parametrize("name, n, k", _GPU_SHAPES, ids=[s[0] for s in _GPU_SHAPES])
def test_gemv_on_gpu_at_model_shapes(name, n, k, m):
    x, weight, scale = _gpu_case(n, k, m, (128, 128), "ue8m0", seed=n + k + m)
    want = fp8_linear(x, weight, scale, act_block=128, impl="torch").float()  # the torch reference, on the GPU
    mma = fp8_linear(x, weight, scale, act_block=128, kernel="mma").float()
    got = fp8_linear(x, weight, scale, act_block=128, kernel="gemv")
    bits = fp8_gemv_triton(x, weight, scale, (128, 128), 128, cvt="bits")
    assert torch.equal(got, bits)  # same values, same order: the two decoders give the same bits
    tol = dict(rtol=2**-7, atol=1e-5 * want.abs().max().item())
    torch.testing.assert_close(got.float(), want, **tol)
    torch.testing.assert_close(got.float(), mma, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("block, act_block, scale_fmt", [((32, 32), 32, "ue8m0"), ((128, 128), 128, "fp32"),
                                                         ((128, 128), None, "ue8m0")])
def test_gemv_on_gpu_v41_blocks_fp32_scales_weight_only(block, act_block, scale_fmt, m):
    x, weight, scale = _gpu_case(1280, 5120, m, block, scale_fmt, seed=m)
    xf = x.float()  # fp32 output: the fp32 summation order is the only difference
    want = fp8_linear(xf, weight, scale, block, act_block=act_block, impl="torch")
    for split_k in (None, 1, 5):
        got = fp8_gemv_triton(xf, weight, scale, block, act_block, split_k=split_k)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())
