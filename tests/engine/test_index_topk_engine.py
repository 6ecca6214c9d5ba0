"""The indexer's top-k kernel inside the engine (interpreted on the CPU, forced on for every impl):
the tiny model's greedy speculative output (k = 3: verify rows through the decode path, prefill chunks
through `select_topk`) is the plain torch.sort engine's token for token."""

from __future__ import annotations

import functools

import pytest
import torch

import v4serve.ops.indexer as indexer_ops
from v4serve.engine import Engine, EngineArgs, SamplingParams
from v4serve.ops.index_topk_triton import index_topk_triton

torch.set_num_threads(1)

PROMPTS = [list(range(10, 80))]  # 70 tokens: 17 compressed rows > top-8
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
# max_model_len 128: decode rows of 32 compressed columns (the default 4096 gave 1024-column rows,
# ~10 s an interpreted launch).
ARGS = dict(model="tiny", device="cpu", max_num_seqs=1, max_num_batched_tokens=32, max_model_len=128, progress=False)


def _run(**spec) -> dict[str, list[int]]:
    engine = Engine(EngineArgs(**ARGS, **spec))
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, PARAMS)
    out = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                out[o.request_id] = o.outputs[0].token_ids
    return out


@pytest.fixture
def kernel_topk(monkeypatch):
    """Every top-k of the indexer through the kernel (a short loop step: the interpreter's time)."""
    calls = []

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return functools.partial(index_topk_triton, block=256)(*args, **kwargs)

    monkeypatch.setattr(indexer_ops, "_topk_on_device", lambda impl, scores: True)
    monkeypatch.setattr(indexer_ops, "index_topk_triton", counted)
    return calls


@pytest.mark.slow  # ~15 s of interpreted top-k launches on one core (6 tokens: the prefill's and verify steps')
def test_engine_with_the_kernel_is_the_sort_engine(kernel_topk):
    with pytest.MonkeyPatch.context() as plain_sort:  # the reference run: torch.sort
        plain_sort.setattr(indexer_ops, "_topk_on_device", lambda impl, scores: False)
        want = _run()
    assert _run(speculative_config={"method": "mtp", "num_speculative_tokens": 3}) == want
    assert any(shape[-1] > 8 for shape in kernel_topk)  # rows past top-k: a real selection ran
