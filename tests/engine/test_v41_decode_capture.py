"""DeepSeek-V4.1's decode step, as the CUDA-graph runner captures it (`DecodeRunner._forward`), runs
no op that breaks a capture (`tests/capture_guard.py`) and gives the logits the step gives unguarded.

The model is the golden checkpoint (tests/data/v41-golden: every V4.1 role in 8 layers: window,
Engram, kv sources of ratio 2 and 1, a reuse layer, the candidate source and a candidate-restricted
reindex layer) in its packed formats (fp8_e8m0_b32 window rows, fp4_e4m3_b16 compressed rows,
fp4_e8m0_b32 index keys), with the torch kernels (the Triton ones under the interpreter are far
too slow here; they run captured on the GPU: tests/model/test_v41_preset.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from capture_guard import NoCaptureBreakingOps
from v4serve.engine import Engine, EngineArgs, SamplingParams

torch.set_num_threads(1)

GOLDEN = Path(__file__).parents[1] / "data" / "v41-golden"


def _written_tensors(cache) -> list[torch.Tensor]:
    """What a decode step writes: every pool, compressor / indexer state and the Engram token history."""
    return [*(p.data for p in cache._pools), *(s.stacked for s in cache._states), cache.token_history]


@pytest.mark.parametrize("selection", ["torch", "device"])
def test_v41_decode_step_is_capture_safe_and_matches_the_unguarded_step(selection, monkeypatch):
    """selection "device": the indexer's CUDA path (`IndexerV41._select_on_device`: scores over the
    packed key pool as lists of candidate blocks, device-side top-k), its scores in torch."""
    if selection == "device":
        from v4serve.model import csa2
        from v4serve.ops.v41_index import v41_index_scores

        monkeypatch.setattr(csa2, "use_triton", lambda impl, *tensors: True)
        monkeypatch.setattr(csa2, "v41_index_scores", lambda *a, impl, **kw: v41_index_scores(*a, impl="torch", **kw))
    engine = Engine(EngineArgs(model=str(GOLDEN), device="cpu", max_num_seqs=4, kernels="torch",
                               kv_cache_dtype="auto", progress=False, max_model_len=128,
                               enable_prefix_caching=False))
    assert engine.runner.plan[2].packed and engine.runner.plan[2].compressed_format.name == "fp4_e4m3_b16"
    runner, cache = engine.decode_runner, engine.runner.cache
    forward, steps = runner._forward, []

    def guarded_then_unguarded(n):
        saved = [t.clone() for t in _written_tensors(cache)]
        with NoCaptureBreakingOps():
            guarded = forward(n)
        for t, before in zip(_written_tensors(cache), saved):  # run the same step again from the same cache
            t.copy_(before)
        unguarded = forward(n)
        steps.append(n)
        torch.testing.assert_close(guarded, unguarded, rtol=0, atol=0)
        return unguarded

    runner._forward = guarded_then_unguarded
    # Prompts ending on both parities (ratio-2 blocks complete in decode) and past the window (16).
    for i, n in enumerate((5, 18, 41)):
        engine.add_request(str(i), list(range(10, 10 + n)), SamplingParams(temperature=0.0, max_tokens=3,
                                                                            ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert steps
