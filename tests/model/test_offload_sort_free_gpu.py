"""An offloaded V4-Flash MoE layer's decode steps on the sort-free passes, on the GPU (`pytest -m
gpu`; not run in CI): E 256, D 4096, I 2048, top-6, 48 experts in pinned host memory, 12 slots
(the 43-layer stage's shape: ~45 host experts a layer at offload auto). Each step's output has the
bits of the same layer with every expert on the GPU, on the GEMV route and on the tensor-core one
(Gluon on sm_90), at c1 (one chunk) and c8 (48 picks: four chunks by shape), eager and replayed
from a CUDA graph that holds the plans and the fetches (new routing at every replay)."""

from __future__ import annotations

import pytest
import torch

from v4serve.model.quantized import EXPERT_TENSORS, MXFP4Experts
from v4serve.model.quantized_offload import ExpertOffload
from v4serve.presets import preset_config

pytestmark = pytest.mark.gpu
HOST = list(range(3, 256, 5))[:48]  # 48 host experts spread over the ids
SLOTS = 12


def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")


def _flash_layers(tensor_cores: bool):
    """(all resident, offloaded) Flash MoE layers holding the same random experts (scale bytes
    118..124: the tensor-core route's guard passes), the decode route bound on both."""
    config = preset_config("deepseek-v4-flash")
    gen = torch.Generator(device="cuda").manual_seed(31)
    with torch.device("cuda"):
        resident, offloaded = MXFP4Experts(config), MXFP4Experts(config)
    offload = ExpertOffload(offloaded, HOST, SLOTS, torch.device("cuda"))
    for name in EXPERT_TENSORS:
        param = getattr(resident, name)
        low, high = (118, 125) if name.endswith("scale_inv") else (0, 256)
        param.data.copy_(torch.randint(low, high, param.shape, generator=gen, device="cuda", dtype=torch.int32))
        for e in range(param.shape[0]):
            offload.dest(name, e).copy_(param[e])
        del offloaded._parameters[name]
    offloaded.offload = offload
    for module in (resident, offloaded):
        assert module.bind_decode(tensor_cores) is tensor_cores
    return resident, offloaded


def _step(tokens: int, seed: int):
    """x, router-like picks with host experts among them, weights, the shared expert's add."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (0.25 * torch.randn(tokens, 4096, generator=gen, device="cuda")).to(torch.bfloat16)
    experts = torch.rand(tokens, 256, generator=gen, device="cuda").topk(6, 1).indices
    experts[:, 0] = torch.tensor(HOST, device="cuda")[torch.randint(0, 48, (tokens,), generator=gen, device="cuda")]
    weights = torch.rand(tokens, 6, generator=gen, device="cuda")
    add = torch.randn(tokens, 4096, generator=gen, device="cuda").to(torch.bfloat16)
    return x, experts, weights, add


@pytest.mark.parametrize("tensor_cores", [False, True], ids=["gemv", "tensor-cores"])
@pytest.mark.parametrize("tokens", [1, 8])
def test_flash_offloaded_decode_has_the_resident_bits_gpu(tokens, tensor_cores, monkeypatch):
    _needs_cuda()
    resident, offloaded = _flash_layers(tensor_cores)
    passes = []
    pass_outputs = MXFP4Experts.pass_outputs
    monkeypatch.setattr(MXFP4Experts, "pass_outputs", lambda *args: passes.append(1) or pass_outputs(*args))
    for seed in range(3):  # slots filled, then reused and evicted
        step = _step(tokens, seed)
        assert torch.equal(offloaded(*step), resident(*step)), seed
    chunks = 1 if tokens == 1 else 4
    assert len(passes) == 3 * (1 + chunks)  # the resident pass and each chunk's, sort-free
    assert offloaded.offload.fetches >= 3


@pytest.mark.parametrize("tensor_cores", [False, True], ids=["gemv", "tensor-cores"])
def test_flash_offloaded_decode_replays_from_a_cuda_graph_gpu(tensor_cores):
    """c8 captured once (plans, fetches on the side stream, passes, combine), replayed on new
    routing and inputs: the all-resident layer's bits each time, fetches made by the replays."""
    _needs_cuda()
    resident, offloaded = _flash_layers(tensor_cores)
    x, experts, weights, add = _step(8, seed=40)
    offloaded(x, experts, weights, add)  # compiles every kernel before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = offloaded(x, experts, weights, add)
    for seed in (41, 42, 43):
        before = offloaded.offload.fetches
        for held, new in zip((x, experts, weights, add), _step(8, seed)):
            held.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, resident(x, experts, weights, add)), seed
        assert offloaded.offload.fetches > before  # a host expert among each token's picks: fetched
