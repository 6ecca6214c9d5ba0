"""Grouped FP8 projection (`o_a_proj`): the torch reference against a float64 per-group product
built from the block formula; both Triton routes (block-diagonal, one GEMM a group; interpreted on
the CPU at tiny shapes) against the reference; on the GPU at V4-Flash's shape (G 8, R 1024,
I 4096), also captured in a CUDA graph."""

import pytest
import torch

from v4serve.ops.fp8_grouped_linear import fp8_grouped_linear
from v4serve.ops.weight_formats import quantize_fp8_blocks


def _case(t, g, r, i, block, seed=0, device="cpu"):
    gen = torch.Generator(device).manual_seed(seed)
    w = torch.randn(g * r, i, generator=gen, device=device) * torch.logspace(-2, 0, g * r, device=device)[:, None]
    weight, scale = quantize_fp8_blocks(w, block)
    return torch.randn(t, g, i, generator=gen, device=device).bfloat16(), weight, scale


def _float64_groups(x, weight, scale, block, absolute=False):
    """z[t, g] = x[t, g] @ W[g]^T in float64, W[n, i] = code * scale[n // bn, i // bk] written out
    (absolute: |x| @ |W|^T, the sum-order bound's magnitudes)."""
    t, g, i = x.shape
    rows = torch.arange(weight.shape[0], device=x.device)[:, None] // block[0]
    cols = torch.arange(i, device=x.device)[None, :] // block[1]
    w = weight.double() * scale.double()[rows, cols]
    x, w = (x.double().abs(), w.abs()) if absolute else (x, w)
    r = weight.shape[0] // g
    return torch.stack([x[:, j].double() @ w[j * r:(j + 1) * r].T for j in range(g)], dim=1)


def _assert_sum_order_close(got, x, weight, scale, block):
    """Equal to the float64 product up to fp32 sum order and one bf16 rounding: |err| <= 2^-8 |z| +
    gamma_I * sum_i |x w| (fp32)."""
    want = _float64_groups(x, weight, scale, block)
    bound = _float64_groups(x, weight, scale, block, absolute=True)
    err = (got.double() - want).abs()
    assert got.shape == want.shape and got.dtype == x.dtype
    assert torch.all(err <= 2.0**-8 * want.abs() + x.shape[-1] * 2.0**-24 * bound + 1e-30), err.max()


@pytest.mark.parametrize("t, g, r, i, block", [(3, 2, 32, 64, (16, 32)), (1, 4, 16, 40, (16, 16))])
def test_reference_matches_the_float64_per_group_product(t, g, r, i, block):
    x, weight, scale = _case(t, g, r, i, block)
    _assert_sum_order_close(fp8_grouped_linear(x, weight, scale, block, impl="torch"), x, weight, scale, block)


@pytest.mark.parametrize("route", ["blockdiag", "groups"])
@pytest.mark.parametrize("t", [1, 3])
def test_triton_routes_match_the_reference(route, t):
    block = (16, 32)
    x, weight, scale = _case(t, 2, 32, 64, block, seed=t)
    got = fp8_grouped_linear(x, weight, scale, block, impl="triton", route=route)
    _assert_sum_order_close(got, x, weight, scale, block)


def test_auto_route_switches_at_the_row_limit_and_groups_need_whole_blocks():
    block = (16, 32)
    x, weight, scale = _case(3, 2, 32, 64, block, seed=4)
    ref = fp8_grouped_linear(x, weight, scale, block, impl="triton", route="blockdiag")
    wide = fp8_grouped_linear(x, weight, scale, block, impl="triton", blockdiag_max_rows=6)
    assert not wide.is_contiguous()  # the block-diagonal route's strided view of the diagonal
    narrow = fp8_grouped_linear(x, weight, scale, block, impl="triton", blockdiag_max_rows=5)
    assert narrow.is_contiguous() and torch.equal(wide, ref)
    x, weight, scale = _case(1, 2, 24, 64, block)  # 24 rows a group: 1.5 blocks of 16
    with pytest.raises(ValueError, match="whole scale blocks of 16"):
        fp8_grouped_linear(x, weight, scale, block, impl="triton", route="groups")
    with pytest.raises(ValueError, match="G = 5 groups"):
        fp8_grouped_linear(torch.zeros(1, 5, 64).bfloat16(), weight, scale, block)


FLASH = dict(g=8, r=1024, i=4096, block=(128, 128))


@pytest.mark.gpu
@pytest.mark.parametrize("route, t", [("auto", 1), ("auto", 2), ("auto", 300), ("blockdiag", 5), ("groups", 1),
                                      ("groups", 5)])
def test_flash_shape_on_the_gpu(route, t):
    x, weight, scale = _case(t, device="cuda", seed=t, **FLASH)
    arrivals = torch.zeros(FLASH["g"] * FLASH["r"] // 64, dtype=torch.int32, device="cuda")
    got = fp8_grouped_linear(x, weight, scale, FLASH["block"], route=route, arrivals=arrivals)
    _assert_sum_order_close(got, x, weight, scale, FLASH["block"])
    assert not arrivals.any()  # the split counters are left at zero for the next launch
    torch.testing.assert_close(got, fp8_grouped_linear(x, weight, scale, FLASH["block"], impl="torch"),
                               rtol=2**-7, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 2, 4])
def test_flash_shape_replays_in_a_cuda_graph(t):
    """Captured once (T*G = 8, 16: block-diagonal; 32: a GEMM a group), replayed on new inputs."""
    x, weight, scale = _case(t, device="cuda", seed=10 + t, **FLASH)
    arrivals = torch.zeros(FLASH["g"] * FLASH["r"] // 64, dtype=torch.int32, device="cuda")
    fp8_grouped_linear(x, weight, scale, FLASH["block"], arrivals=arrivals)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_grouped_linear(x, weight, scale, FLASH["block"], arrivals=arrivals).flatten(1)
    x.copy_(_case(t, device="cuda", seed=20 + t, **FLASH)[0])
    graph.replay()
    torch.cuda.synchronize()
    _assert_sum_order_close(out.view(t, FLASH["g"], FLASH["r"]), x, weight, scale, FLASH["block"])
