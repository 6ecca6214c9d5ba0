"""The tensor-core decode MoE projection (ops/mxfp4_moe_mma_triton.py) against the torch reference
(fp32 products and sums of the exactly dequantized weights): only the fp32 sum order differs, so
|y - ref| <= gamma_K sum |w x| (bf16 rounding of y on top). A pick's row does not depend on the
other picks in the launch (bit for bit). Interpreted on the CPU at small shapes; GPU at Flash shapes."""

import pytest
import torch

from v4serve.ops.weight_formats import dequantize_mxfp4
from v4serve.ops.mxfp4_moe_mma_triton import mma_scales_exact, mxfp4_moe_mma_triton
from v4serve.ops.swiglu import clamped_swiglu

LIMIT = 7.0


def _tensors(e, n_w, k, seed, device="cpu"):
    gen = torch.Generator(device=device).manual_seed(seed)
    w = torch.randint(0, 256, (e, n_w, k // 2), generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
    s = torch.randint(118, 129, (e, n_w, k // 32), generator=gen, device=device, dtype=torch.int32).to(torch.uint8)
    return w, s


def _reference(x, w, s, experts, top_k, per_token, swiglu):
    """y[p] = x[row(p)] . W[e_p]^T in fp32 (products exact, sums in k order), rounded to bf16."""
    rows = torch.arange(experts.numel(), device=x.device) // top_k if per_token else torch.arange(experts.numel())
    dense = dequantize_mxfp4(w, s).float()  # [E, N_W, K]
    y = torch.einsum("pk,pnk->pn", x[rows].float(), dense[experts.long()])
    if not swiglu:
        return y.to(x.dtype), y
    gate, up = y.to(x.dtype).chunk(2, dim=-1)
    return clamped_swiglu(gate, up, LIMIT), y


def _bound(x, w, s, experts, top_k, per_token):
    rows = torch.arange(experts.numel()) // top_k if per_token else torch.arange(experts.numel())
    dense = dequantize_mxfp4(w, s).float()
    k = x.shape[1]
    return torch.einsum("pk,pnk->pn", x[rows].float().abs(), dense[experts.long()].abs()) * (k * 2.0**-24)


@pytest.mark.parametrize("swiglu", [False, True])
def test_mma_projection_matches_the_reference(swiglu):
    e, k, n_out, top_k, tokens = 4, 512, 80, 2, 3  # 2 K steps; 80 outputs: a masked last tile
    n_w = 2 * n_out if swiglu else n_out
    w, s = _tensors(e, n_w, k, seed=1)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(tokens if swiglu else tokens * top_k, k, generator=gen).to(torch.bfloat16)
    experts = torch.tensor([0, 3, 3, 3, 1, 2], dtype=torch.int32)  # a repeated expert, within and across tokens
    y = mxfp4_moe_mma_triton(x, w, s, experts, top_k, swiglu, swiglu_limit=LIMIT if swiglu else None)
    ref, fp32 = _reference(x, w, s, experts, top_k, swiglu, swiglu)
    if swiglu:  # compare the projection before the epilogue's roundings: run it without the SwiGLU
        y_lin = mxfp4_moe_mma_triton(x, w, s, experts, top_k, True)
        bound = _bound(x, w, s, experts, top_k, True) + fp32.abs() * 2.0**-8
        assert (y_lin.float() - fp32).abs().le(bound).all()
        assert (y.float() - ref.float()).abs().le(0.05 * ref.float().abs() + 0.05).all()
    else:
        bound = _bound(x, w, s, experts, top_k, False) + fp32.abs() * 2.0**-8
        assert (y.float() - fp32).abs().le(bound).all()


def test_a_picks_row_does_not_depend_on_the_batch():
    e, k, n, top_k = 3, 256, 64, 2
    w, s = _tensors(e, n, k, seed=3)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    experts = torch.tensor([2, 0, 1, 2], dtype=torch.int64)
    full = mxfp4_moe_mma_triton(x, w, s, experts, top_k, False)
    for p in range(4):
        alone = mxfp4_moe_mma_triton(x[p:p + 1], w, s, experts[p:p + 1], 1, False)
        assert torch.equal(alone[0], full[p])


@pytest.mark.parametrize("swiglu", [False, True])
def test_skipped_picks_keep_their_rows(swiglu):
    # picks 0 and 3 carry id E (= 3, past the weight's rows): their rows keep the sentinel, the
    # others have the unskipped launch's bits
    e, k, n_out, top_k = 3, 256, 64, 2
    n_w = 2 * n_out if swiglu else n_out
    w, s = _tensors(e, n_w, k, seed=9)
    x = torch.randn(2 if swiglu else 4, k, generator=torch.Generator().manual_seed(10)).to(torch.bfloat16)
    experts = torch.tensor([2, 0, 1, 2], dtype=torch.int64)
    skipped = torch.tensor([True, False, False, True])
    limit = dict(swiglu_limit=LIMIT) if swiglu else {}
    y = torch.full((4, n_out), -7.0, dtype=torch.bfloat16)
    got = mxfp4_moe_mma_triton(x, w, s, torch.where(skipped, e, experts), top_k, swiglu, y=y, skip_past_rows=True,
                               **limit)
    assert got.data_ptr() == y.data_ptr() and (y[skipped] == -7.0).all()
    assert torch.equal(y[~skipped], mxfp4_moe_mma_triton(x, w, s, experts, top_k, swiglu, **limit)[~skipped])


def test_scales_exact_and_bad_input():
    w, s = _tensors(1, 64, 256, seed=5)
    assert mma_scales_exact(s)
    assert not mma_scales_exact(torch.full_like(s, 129))
    x = torch.randn(1, 256).to(torch.bfloat16)
    with pytest.raises(ValueError, match="bf16"):
        mxfp4_moe_mma_triton(x.float(), w, s, torch.zeros(1, dtype=torch.int32), 1, False)
    with pytest.raises(ValueError, match="BLOCK_K"):
        mxfp4_moe_mma_triton(x[:, :96], w[:, :, :48], s[:, :, :3], torch.zeros(1, dtype=torch.int32), 1, False)


def test_gluon_kernels_positions_pair_with_their_x():
    """The Gluon kernel's K order, emulated on the CPU (Gluon does not run in the interpreter): the
    bytes [t 4, b 2, ii 16] of a step, the decoder's byte order (0, 2, 1, 3) within each 4 bytes
    (its pack), the logical reshape / permute to position p, and the x offset it loads for p."""
    byte = (32 * torch.arange(4)[:, None, None] + 16 * torch.arange(2)[None, :, None]
            + torch.arange(16)[None, None, :])  # the byte each register holds
    order = torch.tensor([0, 2, 1, 3])
    src = byte.reshape(4, 2, 4, 4)[..., order].reshape(4, 2, 16)  # the byte each decoded element comes from
    at_p = src.reshape(4, 2, 4, 2, 2).permute(1, 2, 3, 0, 4).reshape(128)
    # X's column 0 as _x_operands builds it: lane m = 8t + 2c + b loads x elements
    # 2 (32t + 16b + 4c) + j, j = 2 beta + parity; logical [t, c, b, e, u] with beta = 2e + u
    m, j = torch.arange(32)[:, None], torch.arange(8)[None, :]
    elem = 2 * (32 * (m // 8) + 16 * (m % 2) + 4 * ((m // 2) % 4)) + j  # [32, 8]
    even = elem.reshape(32, 4, 2)[..., 0]
    even_at_p = even.reshape(4, 4, 2, 2, 2).permute(2, 1, 4, 0, 3).reshape(128)
    assert torch.equal(2 * at_p, even_at_p)  # low nibble of byte j = element 2j (the high one: + 1)
    assert sorted(at_p.tolist()) == list(range(128))


def _flash_case(tokens: int):
    """V4-Flash on the GPU: gate_up [256, 4096, 4096 / 2], down [256, 4096, 2048 / 2], `tokens` rows,
    top-6 picks a token."""
    w13, s13 = _tensors(256, 4096, 4096, seed=6, device="cuda")
    w2, s2 = _tensors(256, 4096, 2048, seed=7, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(8)
    x = torch.randn(tokens, 4096, generator=gen, device="cuda").to(torch.bfloat16)
    experts = torch.rand(tokens, 256, generator=gen, device="cuda").topk(6, 1).indices.reshape(-1).contiguous()
    return w13, s13, w2, s2, x, experts


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8, 16, 32])
def test_mma_gluon_flash_shapes_gpu(tokens):
    """The Gluon kernel against the `tl` one and production, Flash shapes (sm_90 only)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    from v4serve.ops.mxfp4_moe_decode_triton import mxfp4_moe_pick_triton
    from v4serve.ops.mxfp4_moe_mma_gluon import mxfp4_moe_mma_gluon
    w13, s13, w2, s2, x, experts = _flash_case(tokens)
    h = mxfp4_moe_mma_gluon(x, w13, s13, experts, 6, True, swiglu_limit=LIMIT)
    h_prod = mxfp4_moe_pick_triton(x, w13, s13, experts, 6, True, swiglu_limit=LIMIT)
    assert (h.float() - h_prod.float()).norm() / h_prod.float().norm() < 1e-2
    y = mxfp4_moe_mma_gluon(h_prod, w2, s2, experts, 6, False)
    y_prod = mxfp4_moe_pick_triton(h_prod, w2, s2, experts, 6, False)
    assert (y.float() - y_prod.float()).abs().le(_gpu_bound(h_prod, w2, s2, experts)).all()
    assert torch.equal(mxfp4_moe_mma_gluon(h_prod[:6], w2, s2, experts[:6], 6, False), y[:6])


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [2, 3, 4, 6, 9])
@pytest.mark.parametrize("tokens", [1, 8])
def test_mma_gluon_staged_is_the_register_loop_bit_for_bit_gpu(tokens, stages):
    """The K loop over cp.async shared-memory stages (STAGES) feeds the same decoded weights and X
    into the same MMAs in the same K order as the register loop: the same bits, both projections
    (down's K 2048 = 8 steps: 9 stages is the most it takes, every step in flight at once)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    from v4serve.ops.mxfp4_moe_mma_gluon import mxfp4_moe_mma_gluon
    w13, s13, w2, s2, x, experts = _flash_case(tokens)
    h = mxfp4_moe_mma_gluon(x, w13, s13, experts, 6, True, swiglu_limit=LIMIT, stages=0)
    assert torch.equal(mxfp4_moe_mma_gluon(x, w13, s13, experts, 6, True, swiglu_limit=LIMIT, stages=stages), h)
    y = mxfp4_moe_mma_gluon(h, w2, s2, experts, 6, False, stages=0)
    assert torch.equal(mxfp4_moe_mma_gluon(h, w2, s2, experts, 6, False, stages=stages), y)
    assert y.float().norm() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [0, 4])
@pytest.mark.parametrize("routing", ["uniform", "shared", "skipped"])
def test_mma_gluon_grouped_is_a_program_a_pick_bit_for_bit_gpu(routing, stages):
    """Up to 8 picks of one expert a program (GROUPED: X's rows 0..7, column j of the MMA for member j)
    store the bits a program a pick stores (column 0), every pick's row. Routing: uniform over 20
    tokens (a few repeated experts), 20 tokens on the same 6 experts (groups of 8, 8, 4: three
    leading programs an expert), or that with every third pick skipped (an offload pass's id past
    the weight's rows: its row keeps the sentinel; the groups form among the other picks)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    from v4serve.ops.mxfp4_moe_mma_gluon import mxfp4_moe_mma_gluon
    w13, s13, w2, s2, x, experts = _flash_case(20)
    if routing != "uniform":
        experts = torch.tensor([3, 250, 17, 99, 128, 64], device="cuda").repeat(20)
    skip = dict(skip_past_rows=routing == "skipped")
    if routing == "skipped":
        experts = torch.where(torch.arange(120, device="cuda") % 3 == 1, w13.shape[0], experts)
    sentinel = dict(dtype=torch.bfloat16, device="cuda")
    runs = {}
    for grouped in (False, True):
        h = torch.full((120, 2048), float("nan"), **sentinel)
        mxfp4_moe_mma_gluon(x, w13, s13, experts, 6, True, swiglu_limit=LIMIT, y=h, stages=stages, grouped=grouped,
                            **skip)
        y = torch.full((120, 4096), float("nan"), **sentinel)
        mxfp4_moe_mma_gluon(h.nan_to_num(), w2, s2, experts, 6, False, y=y, stages=stages, grouped=grouped, **skip)
        runs[grouped] = h, y
    live = experts < w13.shape[0]
    for a, b in zip(runs[False], runs[True]):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
        assert not a[live].isnan().any() and a[~live].isnan().all()
    assert runs[True][1][live].float().norm() > 0


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8, 32])
@pytest.mark.parametrize("mode", ["pair", "chain"])
def test_mma_gluon_dependent_down_launch_is_bit_for_bit_gpu(tokens, mode):
    """gate_up with TRIGGER, then down as its programmatic dependent launch (the first weight stages
    requested before griddepcontrol.wait, x after); "chain" (production): gate_up also a dependent
    launch of the kernel that writes its x, waiting for it first, and down triggering what follows it
    (a sum of its rows) when its grid is one wave. The plain pair's bits, eager and replayed from a
    CUDA graph whose input changed after capture (a down that read x before gate_up finished, or a
    gate_up that read x before its producer finished, would see the previous replay's rows)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("needs an sm_90 GPU")
    from v4serve.ops.mxfp4_moe_mma_gluon import mxfp4_moe_mma_gluon
    w13, s13, w2, s2, x, experts = _flash_case(tokens)
    chain = mode == "chain"

    def pair(x, dependent):
        x = x * 2  # the producer of gate_up's x, launched right before it
        h = mxfp4_moe_mma_gluon(x, w13, s13, experts, 6, True, swiglu_limit=LIMIT, pdl_trigger=dependent,
                                pdl_wait_first=dependent and chain)
        y = mxfp4_moe_mma_gluon(h, w2, s2, experts, 6, False, pdl_wait=dependent,
                                pdl_trigger=None if dependent and chain else False)
        return h, y, y.float().sum(0)  # the consumer of down's rows, launched right after it

    want = pair(x, False)
    assert all(torch.equal(a, b) for a, b in zip(want, pair(x, True)))
    graph_x = x.clone()
    pair(graph_x, True)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = pair(graph_x, True)
    for seed in (1, 2):
        graph_x.copy_(torch.randn(x.shape, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda"))
        graph.replay()
        want = pair(graph_x.clone(), False)
        assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_mma_gluon_members_table_is_checked():
    """A grouped launch reads moe_pick_groups' int32 [P, 8] table: another shape is refused by name."""
    from v4serve.ops.mxfp4_moe_mma_gluon import mxfp4_moe_mma_gluon
    w2, s2 = _tensors(2, 64, 1024, seed=1, device="cpu")
    x = torch.zeros(2, 1024, dtype=torch.bfloat16)
    table = torch.full((12, 4), -1, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"members must be moe_pick_groups' contiguous int32 \[12, 8\]"):
        mxfp4_moe_mma_gluon(x, w2, s2, torch.zeros(12, dtype=torch.int64), 6, True, grouped=True, members=table)


def test_mma_gluon_stage_count_is_checked():
    """A ring needs 2 .. K / 256 + 1 stages (0: the register loop): any other count is refused by name."""
    from v4serve.ops.mxfp4_moe_mma_gluon import mxfp4_moe_mma_gluon
    w2, s2 = _tensors(2, 64, 1024, seed=1, device="cpu")
    x = torch.zeros(1, 1024, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="stages must be 0 or 2 .. 5"):
        mxfp4_moe_mma_gluon(x, w2, s2, torch.zeros(6, dtype=torch.int64), 6, True, stages=6)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8, 16, 32])
def test_mma_flash_shapes_gpu(tokens):
    """V4-Flash: gate_up [256, 4096, 4096 / 2] with the SwiGLU, down [256, 4096, 2048 / 2], top-6."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from v4serve.ops.mxfp4_moe_decode_triton import mxfp4_moe_pick_triton
    w13, s13, w2, s2, x, experts = _flash_case(tokens)
    h = mxfp4_moe_mma_triton(x, w13, s13, experts, 6, True, swiglu_limit=LIMIT)
    h_prod = mxfp4_moe_pick_triton(x, w13, s13, experts, 6, True, swiglu_limit=LIMIT)
    assert (h.float() - h_prod.float()).norm() / h_prod.float().norm() < 1e-2
    y = mxfp4_moe_mma_triton(h_prod, w2, s2, experts, 6, False)
    y_prod = mxfp4_moe_pick_triton(h_prod, w2, s2, experts, 6, False)
    assert (y.float() - y_prod.float()).norm() / y_prod.float().norm() < 1e-2
    assert (y.float() - y_prod.float()).abs().le(_gpu_bound(h_prod, w2, s2, experts)).all()
    alone = mxfp4_moe_mma_triton(h_prod[:6], w2, s2, experts[:6], 6, False)
    assert torch.equal(alone, y[:6])  # row independence


def _gpu_bound(x, w, s, experts):
    """Per pick: 2 K 2^-24 sum |w x| (the fp32 sum order) + 2^-7 sum |w x| (bf16 rounding of both)."""
    mag = torch.stack([x[p].float().abs() @ dequantize_mxfp4(w[e], s[e]).abs().T
                       for p, e in enumerate(experts.tolist())])
    return mag * (2 * x.shape[1] * 2.0**-24) + mag * 2.0**-7
