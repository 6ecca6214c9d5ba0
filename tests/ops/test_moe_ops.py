"""MoE routing, pick sort, clamped SwiGLU and combine: Triton kernels (interpreted on the CPU) against
their torch references, and the routed path end to end at V4-Flash shapes on the GPU (256 experts,
top-6, hidden 4096, intermediate 2048)."""

import pytest
import torch

from v4serve.ops.grouped_matmul import grouped_matmul
from v4serve.ops.moe_combine import moe_combine
from v4serve.ops.moe_route import moe_route
from v4serve.ops.moe_sort import moe_sort
from v4serve.ops.swiglu import clamped_swiglu


def _by_expert(experts, weights):
    """A token's picks in expert order (the order of its k picks is unspecified)."""
    order = experts.argsort(dim=1, stable=True)
    return experts.gather(1, order), weights.gather(1, order)


def _route_args(T, E, k, hashed, seed, device="cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(T, E, generator=g) * 4).to(dtype)
    if hashed:
        table = dict(tid2eid=torch.randint(0, E, (50, k), generator=g), token_ids=torch.randint(0, 50, (T,), generator=g))
    else:
        table = dict(bias=torch.randn(E, generator=g) * 0.1)
    return logits.to(device), {name: t.to(device) for name, t in table.items()}


@pytest.mark.parametrize("scoring", ["sqrtsoftplus", "sigmoid", "softmax"])
@pytest.mark.parametrize("hashed", [False, True])
@pytest.mark.parametrize("T,E,k,normalize", [(1, 256, 6, True), (7, 40, 3, False), (9, 16, 2, True), (0, 8, 2, True)])
def test_route_kernel_matches_reference(scoring, hashed, T, E, k, normalize):
    logits, table = _route_args(T, E, k, hashed, seed=T * E + k)
    got = moe_route(logits, k, scoring, normalize, 2.5, impl="triton", **table)
    want = moe_route(logits, k, scoring, normalize, 2.5, impl="torch", **table)
    assert got[0].dtype == torch.int64 and got[1].dtype == torch.float32
    got, want = _by_expert(*got), _by_expert(*want)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("hashed", [False, True])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_route_rows_route_padding_as_live_rows(hashed, impl):
    """A decode batch of 3 live rows padded to 8: rows 3..7 routed as rows 0, 1, 2, 0, 1."""
    logits, table = _route_args(8, 64, 6, hashed, seed=11)
    rows = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    experts, weights = moe_route(logits, 6, "sqrtsoftplus", True, 2.5, rows=rows, impl=impl, **table)
    live_experts, live_weights = moe_route(logits[:3], 6, "sqrtsoftplus", True, 2.5, impl=impl,
                                           **{k: v[:3] if k == "token_ids" else v for k, v in table.items()})
    assert torch.equal(experts, live_experts[rows]) and torch.equal(weights, live_weights[rows])
    assert set(experts.flatten().tolist()) == set(live_experts.flatten().tolist())  # no expert added


def test_route_kernel_orders_by_biased_score_and_breaks_ties_low():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0, -1.0, 3.0]]).bfloat16()
    experts, _ = moe_route(logits, 3, "sqrtsoftplus", True, 1.0, bias=torch.zeros(6), impl="triton")
    assert experts.tolist() == [[1, 3, 5]]
    experts, _ = moe_route(logits, 2, "sigmoid", True, 1.0, bias=torch.tensor([0, 0, 0, 0, 9.0, 0]), impl="triton")
    assert experts.tolist() == [[4, 1]]


def test_route_softplus_keeps_precision_for_large_and_small_logits():
    logits = torch.tensor([[-40.0, -18.0, -3.0, 0.0, 5.0, 19.5, 20.5, 90.0]])
    got = moe_route(logits, 8, "sqrtsoftplus", False, 1.0, bias=torch.zeros(8), impl="triton")
    want = moe_route(logits, 8, "sqrtsoftplus", False, 1.0, bias=torch.zeros(8), impl="torch")
    torch.testing.assert_close(_by_expert(*got)[1], _by_expert(*want)[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("T,k,E", [(1, 6, 256), (37, 3, 8), (70, 2, 100), (5, 4, 3), (0, 6, 16)])
def test_sort_kernel_is_exact(T, k, E):
    g = torch.Generator().manual_seed(T + E)
    experts = torch.randint(0, E, (T, k), generator=g)
    if T > 2:
        experts[1] = experts[0]  # tokens that agree
        experts[2, :2] = experts[2, 0]  # a hash table may repeat an expert
    for got, want in zip(moe_sort(experts, E, impl="triton"), moe_sort(experts, E, impl="torch")):
        assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("M,I", [(3, 100), (5, 1500), (0, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_swiglu_kernel_matches_reference(M, I, dtype):
    gate_up = (torch.randn(M, 2 * I, generator=torch.Generator().manual_seed(M + I)) * 6).to(dtype)
    gate, up = gate_up.chunk(2, dim=-1)  # strided halves, as the grouped matmul's output gives them
    got = clamped_swiglu(gate, up, 7.0, impl="triton")
    want = clamped_swiglu(gate, up, 7.0, impl="torch")
    tol = dict(rtol=0, atol=0) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("T,k,D,with_add", [(3, 6, 100, True), (5, 2, 700, False), (0, 6, 64, True)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_combine_kernel_matches_reference(T, k, D, with_add, dtype):
    g = torch.Generator().manual_seed(T * k + D)
    _, _, pos = moe_sort(torch.randint(0, 9, (T, k), generator=g), 9, impl="torch")
    y = torch.randn(T * k, D, generator=g).to(dtype)
    weights = torch.rand(T, k, generator=g)
    add = torch.randn(T, D, generator=g).to(dtype) if with_add else None
    got = moe_combine(y, pos, weights, add, impl="triton")
    want = moe_combine(y, pos, weights, add, impl="torch")
    torch.testing.assert_close(got, want, rtol=1e-6 if dtype == torch.float32 else 0, atol=1e-6 if dtype == torch.float32 else 0)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="rows must be integer"):
        moe_route(torch.zeros(4, 8), 2, "sigmoid", True, 1.0, bias=torch.zeros(8), rows=torch.zeros(3, dtype=torch.long))
    logits = torch.randn(2, 8)
    with pytest.raises(ValueError, match="either bias"):
        moe_route(logits, 2, "sigmoid", True, 1.0)
    with pytest.raises(ValueError, match="scoring_func"):
        moe_route(logits, 2, "relu", True, 1.0, bias=torch.zeros(8))
    with pytest.raises(ValueError, match="tid2eid"):
        moe_route(logits, 2, "sigmoid", True, 1.0, tid2eid=torch.zeros(5, 3, dtype=torch.long),
                  token_ids=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="experts must be"):
        moe_sort(torch.zeros(4), 8)
    with pytest.raises(ValueError, match="gate and up"):
        clamped_swiglu(torch.zeros(2, 4), torch.zeros(2, 5), 7.0)
    with pytest.raises(ValueError, match="add must be"):
        moe_combine(torch.zeros(4, 8), torch.arange(4), torch.ones(2, 2), torch.zeros(2, 7))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 64, 2048])
def test_routed_path_at_flash_shapes(T):
    """Route, sort, grouped matmuls, SwiGLU and combine with the Triton kernels against the torch ops,
    both from the same logits, at 256 experts, top-6, hidden 4096, intermediate 2048."""
    E, k, D, I = 256, 6, 4096, 2048
    logits, table = _route_args(T, E, k, hashed=False, seed=T, device="cuda", dtype=torch.bfloat16)
    g = torch.Generator(device="cuda").manual_seed(T)
    x = torch.randn(T, D, device="cuda", generator=g).bfloat16()
    gate_up_w = (torch.randn(E, 2 * I, D, device="cuda", generator=g) / D**0.5).bfloat16()
    down_w = (torch.randn(E, D, I, device="cuda", generator=g) / I**0.5).bfloat16()
    shared = torch.randn(T, D, device="cuda", generator=g).bfloat16()
    outs = []
    for impl in ("triton", "torch"):
        experts, weights = moe_route(logits, k, "sqrtsoftplus", True, 2.5, impl=impl, **table)
        rows, ends, pos = moe_sort(experts, E, impl=impl)
        gate, up = grouped_matmul(x, gate_up_w, rows, ends, impl="triton").chunk(2, dim=-1)
        hidden = clamped_swiglu(gate, up, 10.0, impl=impl)
        y = grouped_matmul(hidden, down_w, torch.arange(T * k, device="cuda"), ends, impl="triton")
        outs.append((experts, weights, moe_combine(y, pos, weights, shared, impl=impl)))
    (e_tri, w_tri, out_tri), (e_ref, w_ref, out_ref) = outs
    got, want = _by_expert(e_tri, w_tri), _by_expert(e_ref, w_ref)
    assert torch.equal(got[0], want[0])
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)
    # Same picks; the two paths differ only in the order of a token's k picks (fp32 sum order).
    torch.testing.assert_close(out_tri.float(), out_ref.float(), rtol=2e-2, atol=2e-2)
