"""DeepSeek-V4.1's indexer on its device path (model/csa2.py `_select_on_device`: the Triton kernels
of ops/v41_index.py over the packed index-key pool, candidate blocks as lists, candidate-mode
scoring in the Reindex layer; here under the interpreter, the other ops in torch) against the torch
path on the golden model: a chunked prefill and decode steps select the same rows and give the
same logits."""

import torch

from v41_golden import GoldenRunner, Record
from v4serve.model import csa2
from v4serve.ops.v41_index import v41_index_scores


def _run(runner):
    runner.record = Record()
    g = runner.golden
    cache = runner.new_cache()
    slot = cache.open_sequence()
    prefill = runner.prefill(cache, slot, g["input_ids"].tolist(), chunks=[31, 46])
    decode = runner.decode(cache, slot, g["decode.tokens_in"].tolist()[:2], g["input_ids"].numel())
    return runner.record.topk, prefill, decode


def test_device_selection_matches_the_torch_path(monkeypatch):
    runner = GoldenRunner()  # kernels bound to torch
    topk_torch, prefill_torch, decode_torch = _run(runner)
    # the device path with only the indexer kernels in Triton (the interpreter runs them slowly)
    monkeypatch.setattr(csa2, "use_triton", lambda impl, *tensors: True)
    monkeypatch.setattr(csa2, "v41_index_scores", lambda *a, impl, **kw: v41_index_scores(*a, impl="triton", **kw))
    topk_dev, prefill_dev, decode_dev = _run(runner)
    assert sorted(topk_dev) == sorted(topk_torch) == [2, 4, 6]  # full (r2), candidate source (r1), reindex
    for layer in topk_torch:
        for got, want in zip(topk_dev[layer], topk_torch[layer], strict=True):
            assert torch.equal(got, want), layer
    assert torch.equal(prefill_dev, prefill_torch) and torch.equal(decode_dev, decode_torch)
