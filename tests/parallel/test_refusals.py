"""tensor_parallel_size > 1 refuses what it cannot shard yet, naming the flags, before any rank starts."""

from __future__ import annotations

import pytest
import torch

from v4serve.engine.args import EngineArgs
from v4serve.engine.model_runner import ModelRunner
from v4serve.model.loader import build_model
from v4serve.parallel.shard import refuse_unsupported


@pytest.mark.parametrize("fields, words", [
    ({"cpu_offload_gb": 1.0}, ("tensor_parallel_size 2", "cpu_offload_gb", "future work")),
    ({"cpu_offload_gb": "auto"}, ("tensor_parallel_size 2", "cpu_offload_gb")),
])
def test_runner_refuses_before_starting_workers(fields, words):
    args = EngineArgs(model="tiny", device="cpu", tensor_parallel_size=2, progress=False, **fields)
    with pytest.raises(ValueError) as err:
        ModelRunner(args, torch.device("cpu"), torch.float32)
    for word in words:
        assert word in str(err.value)


def test_one_rank_accepts_everything():
    refuse_unsupported("auto", tensor_parallel_size=1)


def test_sharded_build_refuses_offloaded_experts():
    with pytest.raises(ValueError, match="tensor_parallel_size > 1.*cpu_offload_gb"):
        build_model("tiny", "cpu", torch.float32, progress=False, quantization="fp8", cpu_offload_gb=1,
                    shard=lambda net: {})
