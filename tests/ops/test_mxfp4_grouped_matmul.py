"""MXFP4 grouped matmul: the torch reference and the Triton kernel (interpreted on the CPU)
against a per-pick loop over weights decoded nibble by nibble, with empty groups, uneven group
sizes and K, N not multiples of the tiles."""

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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_decodes_every_code_on_gpu_bit_for_bit():
    n_scales = 253
    weight = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(n_scales, 1)[None].cuda()
    scale = torch.arange(n_scales, dtype=torch.int32).to(torch.uint8)[:, None].expand(n_scales, 16).contiguous()[None].cuda()
    ends = torch.tensor([512], dtype=torch.int32, device="cuda")
    want = _naive_weight(weight[0].cpu(), scale[0].cpu()).T
    got = mxfp4_grouped_matmul(torch.eye(512, device="cuda"), weight, scale, None, ends, impl="triton")
    assert torch.equal(got.cpu(), want.float())
    got = mxfp4_grouped_matmul(torch.eye(512, device="cuda").bfloat16(), weight, scale, None, ends, impl="triton")
    assert torch.equal(got.cpu(), want.bfloat16())


# (experts, N, K) of the fused gate_up ([E, 2I, D]) and down ([E, D, I]) projections
_MOE_GPU = [("flash gate_up", 256, 4096, 4096), ("flash down", 256, 4096, 2048),
            ("pro gate_up", 384, 6144, 7168), ("pro down", 384, 7168, 3072)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tokens", [1, 8, 64, 2048])
@pytest.mark.parametrize("name, e, n, k", _MOE_GPU, ids=[c[0] for c in _MOE_GPU])
def test_triton_on_gpu_at_model_shapes(name, e, n, k, tokens):
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    weight = torch.randint(0, 256, (e, n, k // 2), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    scale = torch.randint(118, 124, (e, n, k // 32), generator=gen, device="cuda", dtype=torch.int32).to(torch.uint8)
    x = torch.randn(tokens, k, generator=gen, device="cuda").bfloat16()
    experts = torch.rand(tokens, e, generator=gen, device="cuda").topk(6, 1).indices
    order = experts.flatten().argsort(stable=True)
    rows = order // 6
    ends = torch.bincount(experts.flatten(), minlength=e).cumsum(0).to(torch.int32)
    want = mxfp4_grouped_matmul(x, weight, scale, rows, ends, impl="torch").float()
    got = mxfp4_grouped_matmul(x, weight, scale, rows, ends, impl="triton").float()
    # exact products (bf16 x, e2m1 * 2^k exact in bf16), fp32 sums in another order: one bf16 ulp
    # plus the fp32 rounding of the sums where they cancel.
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-4 * want.abs().max().item())
