"""Tensor / expert parallelism over NCCL on 2 GPUs (nvidia-h200-x2): the same greedy tokens as one
GPU in float32 (torch kernels, bf16 KV rows), decode replayed as CUDA graphs that capture the
collectives; and each rank's memory. NOT YET RUN: no multi-GPU machine was lent when written."""

from __future__ import annotations

import pytest
import torch

from v4serve import LLM, SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

ARGS = dict(device="cuda", dtype="float32", kernels="torch", kv_cache_dtype="bf16", max_num_seqs=4,
            max_model_len=96, num_kv_pages=6, max_num_batched_tokens=32, progress=False)


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "ep"])
def test_tp2_nccl_matches_one_gpu(expert_parallel):
    prompts = [[5 + i] * n for i, n in enumerate((60, 45, 50, 30))]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    one = [o.outputs[0] for o in LLM("tiny", **ARGS).generate(prompt_token_ids=prompts, sampling_params=params)]
    llm = LLM("tiny", tensor_parallel_size=2, enable_expert_parallel=expert_parallel, **ARGS)
    try:
        assert llm.engine.decode_runner.uses_cuda_graphs
        got = [o.outputs[0] for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
        assert llm.engine.scheduler.num_preemptions > 0
        for a, b in zip(one, got):
            assert a.token_ids == b.token_ids
            assert abs(a.cumulative_logprob - b.cumulative_logprob) / len(a.token_ids) < 1e-4
    finally:
        llm.engine.runner.close()
