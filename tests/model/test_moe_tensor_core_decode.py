"""The MXFP4 experts' decode route on tensor cores (`mxfp4_experts(tensor_cores=True)`, chosen once
per module by `MXFP4Experts.bind_decode`) against the torch reference (`sorted_experts(impl="torch")`:
exactly dequantized weights, fp32 products and sums, the same bf16 roundings).

Tolerance (the moe-mma tests' reasoning, carried through the layer): the route's products are
exact, so each projection differs from the reference only by the fp32 sum order, at most
3 gamma_K sum |w x| (gamma_K = K 2^-24: the reference's sums, and twice that for the MMA's, whose
fp32 adds may truncate; bounded here by 4). Rounded to bf16, the gate and up values lie
within the roundings of the reference's +- that much; the SwiGLU (the reference's roundings) is
evaluated at those corners, plus one bf16 ulp of silu and of the product (`_hidden_bound`). The
down projection adds its sum order to that spread through sum |w| (both sides' bf16 rounding of y:
2^-7 |y|), the combine one more rounding of the output (2^-7 |out|). On the CPU the fp32 sums
rarely move a bf16 rounding: the bits usually agree; on the GPU the MMA's k16 order moves some.

CPU: the `tl` kernel in the interpreter (small shapes: D = I = 256, one K step). GPU (`-m gpu`):
Flash shapes, c1 / c8, the Gluon kernels on sm_90, eager and replayed from a CUDA graph."""

import json

import pytest
import torch

from v4serve.bench import engine as bench_engine
from v4serve.engine import Engine
from v4serve.model.quantized import EXPERT_TENSORS, MXFP4Experts
from v4serve.model.quantized_offload import ExpertOffload
from v4serve.ops import mxfp4_moe_decode
from v4serve.ops.mxfp4_moe_decode import TENSOR_CORE_DECODE, direct_applies, mxfp4_experts, sorted_experts
from v4serve.ops.mxfp4_moe_mma_gluon import gluon_applies, gluon_shapes_fit
from v4serve.ops.swiglu_reference import clamped_swiglu_reference
from v4serve.ops.weight_formats import dequantize_mxfp4
from v4serve.presets import preset_config

LIMIT = 10.0
SMALL = {"hidden_size": 256, "moe_intermediate_size": 256}  # K of both projections: one MMA K step


def _tensors(e, d, i, seed, device="cpu"):
    """gate_up [E, 2I, D/2] and down [E, D, I/2] with scale bytes 118..124 (|w| <= 0.75: O(1) sums)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def packed(rows, cols):
        w = torch.randint(0, 256, (e, rows, cols // 2), generator=gen, device=device, dtype=torch.int32)
        s = torch.randint(118, 125, (e, rows, cols // 32), generator=gen, device=device, dtype=torch.int32)
        return w.to(torch.uint8), s.to(torch.uint8)

    return (*packed(2 * i, d), *packed(d, i))


def _swiglu(gate, up):
    """The reference's SwiGLU on the bf16-rounded halves (`sorted_experts(impl="torch")`)."""
    return clamped_swiglu_reference(gate.to(torch.bfloat16), up.to(torch.bfloat16), LIMIT).float()


def _hidden_bound(g, u, eps_g, eps_u):
    """|h_route - h_ref| per element, g and u the reference's fp32 gate and up: the route's rounded
    gate lies in [R(g - eps_g), R(g + eps_g)] (rounding is monotone), its up likewise, and the
    SwiGLU is monotone in each across such an interval (but at silu's flat minimum), so the corners
    hold its extremes; plus one bf16 ulp of silu and of the product (the kernel's fp32 silu may
    round the other way): 2^-6 |h|."""
    ref = _swiglu(g, u)
    corners = torch.stack([_swiglu(g + a * eps_g, u + b * eps_u) for a in (-1, 1) for b in (-1, 1)])
    return (corners - ref).abs().amax(0) + 2.0**-6 * torch.maximum(corners.abs().amax(0), ref.abs()), ref


def _route_bound(x, experts, weights, tensors, ref):
    """Per output element: how far the tensor-core route may be from the reference `ref` (module
    docstring), from the exactly dequantized weights."""
    w13, s13, w2, s2 = tensors
    d, i = x.shape[1], w2.shape[2] * 2
    gamma_d, gamma_i = d * 2.0**-24, i * 2.0**-24
    bound = 2.0**-7 * ref.float().abs()  # the combine's rounding
    for t in range(x.shape[0]):
        for e, w in zip(experts[t].tolist(), weights[t].float().tolist()):
            gate_up = dequantize_mxfp4(w13[e], s13[e]).float()
            a, mag = gate_up @ x[t].float(), gate_up.abs() @ x[t].float().abs()
            dh, h = _hidden_bound(a[:i], a[i:], 4 * gamma_d * mag[:i], 4 * gamma_d * mag[i:])
            down = dequantize_mxfp4(w2[e], s2[e]).float()
            spread = down.abs() @ dh + 4 * gamma_i * (down.abs() @ h.abs())
            bound[t] += w * ((1 + 2.0**-7) * spread + 2.0**-7 * (down @ h).abs())  # + both bf16 roundings of y
    return bound


def _experts_module(tensors):
    module = MXFP4Experts(preset_config("tiny", SMALL))
    for name, value in zip(EXPERT_TENSORS, tensors):
        getattr(module, name).data.copy_(value)
    module.impl = "triton"
    return module


def test_the_route_stays_sort_free_up_to_its_own_pick_bound(monkeypatch):
    """12 picks over 8 experts (1.5 E, Flash's c64): past the GEMV's 0.75 E, so the GEMV sorts, but
    the tensor-core route stays sort-free (no sort launched), within the route bound; one pick more
    and it sorts too."""
    tensors = _tensors(8, 256, 256, seed=3)
    gen = torch.Generator().manual_seed(4)
    x = (0.25 * torch.randn(6, 256, generator=gen)).to(torch.bfloat16)
    experts = torch.rand(6, 8, generator=gen).topk(2, 1).indices
    weights = torch.rand(6, 2, generator=gen)
    assert direct_applies("triton", x, experts, tensors, tensor_cores=True)
    assert not direct_applies("triton", x, experts, tensors)
    assert not direct_applies("triton", x[:1].expand(13, -1), torch.zeros(13, 1, dtype=torch.long), tensors,
                              tensor_cores=True)

    def no_sort(*args, **kwargs):
        raise AssertionError("the sort-free route sorted")

    monkeypatch.setattr(mxfp4_moe_decode, "sorted_experts", no_sort)  # the module's name, not this file's
    got = mxfp4_experts(x, experts, weights, tensors, LIMIT, impl="triton", tensor_cores=True)
    ref = sorted_experts(x, experts, weights, tensors, LIMIT, impl="torch")
    assert (got.float() - ref.float()).abs().le(_route_bound(x, experts, weights, tensors, ref)).all()


def test_the_layer_on_tensor_cores_matches_the_reference(monkeypatch):
    """The module's V4 decode path with the route bound (8 experts, top-2, 3 tokens: 6 picks =
    0.75 E, the sort-free size; one expert repeated within a token, one shared across tokens)."""
    launches = []
    kernel = mxfp4_moe_decode.mxfp4_moe_mma_triton

    def counted(*args, **kwargs):
        launches.append(args[1].shape)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(mxfp4_moe_decode, "mxfp4_moe_mma_triton", counted)
    tensors = _tensors(8, 256, 256, seed=1)
    module = _experts_module(tensors)
    assert module.bind_decode(True) and module.tensor_core_decode
    gen = torch.Generator().manual_seed(2)
    x = (0.25 * torch.randn(3, 256, generator=gen)).to(torch.bfloat16)
    experts = torch.rand(3, 8, generator=gen).topk(2, 1).indices
    experts[2] = experts[2, 0]
    experts[1, 1] = experts[0, 0]
    weights = torch.rand(3, 2, generator=gen)
    add = torch.randn(3, 256, generator=gen).to(torch.bfloat16)
    assert direct_applies("triton", x, experts, tensors)
    got = module(x, experts, weights, add)
    assert launches == [(8, 512, 128), (8, 256, 128)]  # gate_up, then down, on the `tl` tensor-core kernel
    ref = sorted_experts(x, experts, weights, tensors, LIMIT, add, impl="torch")
    assert (got.float() - ref.float()).abs().le(_route_bound(x, experts, weights, tensors, ref)).all()


def test_a_scale_byte_above_128_keeps_the_gemv():
    """Byte 129 = a block scale 2^2: the decoder's folded multiply 2^(b - 1) would overflow bf16's
    exact range, so the module never takes tensor cores, wherever the byte is."""
    tensors = _tensors(8, 256, 256, seed=3)
    assert _experts_module(tensors).bind_decode(True)
    assert not _experts_module(tensors).bind_decode(False)  # production's rule off: nothing checked
    for which in (1, 3):  # gate_up's scales, down's
        bad = list(tensors)
        bad[which] = bad[which].clone()
        bad[which][5, 7, 1] = 129
        module = _experts_module(bad)
        assert not module.bind_decode(True) and not module.tensor_core_decode
    v41 = _experts_module(tensors)
    v41.act_quant, v41.weight_before_down = (lambda t: t), True
    assert not v41.bind_decode(True)  # V4.1's numerics keep their path


def test_an_offloaded_layer_checks_its_host_experts_too():
    """The device expert cache (resident rows + slots) receives host experts: a 129 among the host
    rows' scales refuses tensor cores even though every device row is exact."""
    tensors = _tensors(8, 256, 256, seed=4)
    for bad_expert, want in ((None, True), (2, False), (6, False)):  # 6, 7: host experts
        module = _experts_module(tensors)
        offload = ExpertOffload(module, [6, 7], 2, torch.device("cpu"))
        for name, value in zip(EXPERT_TENSORS, tensors):
            for e in range(8):
                offload.dest(name, e).copy_(value[e])
            del module._parameters[name]
        module.offload = offload
        if bad_expert is not None:
            offload.dest("down_proj_scale_inv", bad_expert)[0, 0] = 129
        assert module.bind_decode(True) is want


def test_the_gluon_kernel_takes_only_the_shapes_it_fits():
    """Gluon: K % 512 (two 256 steps an iteration), N % 32 (gate_up) / 64 (down), 16-byte rows; the
    route falls back to the `tl` kernel elsewhere (and off sm_90, e.g. here: the interpreter)."""
    flash_down, tp8_down = torch.empty(2, 64, 1024, dtype=torch.uint8), torch.empty(2, 64, 128, dtype=torch.uint8)
    assert gluon_shapes_fit(flash_down, False) and gluon_shapes_fit(flash_down, True)  # N 64 / 32
    assert not gluon_shapes_fit(tp8_down, False)  # I / 8 = 256: one K step
    assert not gluon_shapes_fit(flash_down[:, :32], False)  # N 32 < a down tile
    assert not gluon_shapes_fit(flash_down[:, :, :1016], False)  # K 2032: rows still 16-byte aligned
    assert not gluon_applies(torch.empty(1, 2048, dtype=torch.bfloat16), flash_down, False)  # CPU


def test_the_bench_flag_binds_the_route_when_the_engine_builds():
    """`bench engine --moe-decode`: the engine's MXFP4 layers take tensor cores (the tiny preset in
    the official formats at D = I = 256), those with host experts too (their decode passes take
    the route, and the summary counts them); the default is production's rule."""
    parser = bench_engine._parser()
    common = ["--model", "tiny", "--quantization", "fp8", "--hf-overrides", json.dumps(SMALL), "--concurrency", "1",
              "--max-model-len", "256"]
    assert parser.parse_args(common).moe_decode == ("tensor-cores" if TENSOR_CORE_DECODE else "gemv")
    args = parser.parse_args([*common, "--moe-decode", "tensor-cores", "--cpu-offload-gb", "0.001"])
    engine = Engine(bench_engine.engine_args(args))
    layers = [m for m in engine.model.modules() if isinstance(m, MXFP4Experts)]
    assert any(m.offload is not None and m.offload.host_row for m in layers)
    assert layers and all(m.tensor_core_decode for m in layers)
    assert bench_engine.moe_decode_summary(engine.model, args.moe_decode) == {
        "route": "tensor-cores", "mxfp4_layers": len(layers), "tensor_core_layers": len(layers)}


def _flash_layer(tokens: int):
    """V4-Flash's routed layer on the GPU: E 256, D 4096, I 2048, top-6, router-like picks."""
    tensors = _tensors(256, 4096, 2048, seed=5, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(6)
    x = (0.25 * torch.randn(tokens, 4096, generator=gen, device="cuda")).to(torch.bfloat16)
    experts = torch.rand(tokens, 256, generator=gen, device="cuda").topk(6, 1).indices
    weights = torch.rand(tokens, 6, generator=gen, device="cuda")
    add = torch.randn(tokens, 4096, generator=gen, device="cuda").to(torch.bfloat16)
    return x, experts, weights, add, tensors


def _needs_sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the Gluon route needs an sm_90 GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 8])
def test_flash_layer_on_the_gluon_route_matches_the_reference_gpu(tokens):
    _needs_sm90()
    x, experts, weights, add, tensors = _flash_layer(tokens)
    assert gluon_applies(x, tensors[0], True) and gluon_applies(x, tensors[2], False)
    got = mxfp4_experts(x, experts, weights, tensors, LIMIT, add, tensor_cores=True)
    ref = sorted_experts(x, experts, weights, tensors, LIMIT, add, impl="torch")
    diff = (got.float() - ref.float()).abs()
    assert diff.le(_route_bound(x, experts, weights, tensors, ref)).all()
    assert diff.norm() / ref.float().norm() < 1e-2


@pytest.mark.gpu
def test_the_gluon_route_replays_from_a_cuda_graph_gpu():
    """Captured once (after an eager call compiled it), replayed on new routing: the eager bits."""
    _needs_sm90()
    x, experts, weights, add, tensors = _flash_layer(8)

    def run():
        return mxfp4_experts(x, experts, weights, tensors, LIMIT, add, tensor_cores=True)

    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for seed in (7, 8):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        experts.copy_(torch.rand(8, 256, generator=gen, device="cuda").topk(6, 1).indices)
        x.copy_((0.25 * torch.randn(8, 4096, generator=gen, device="cuda")).to(torch.bfloat16))
        graph.replay()
        assert torch.equal(out, run())
