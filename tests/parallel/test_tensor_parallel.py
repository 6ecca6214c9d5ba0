"""tensor_parallel_size=2 (gloo, 2 processes on the CPU), with and without expert parallelism,
against one process: the same greedy tokens, through chunked prefill, preemption and decode
(continuations included), on the `tiny` preset, on a transformers checkpoint and on one in the
official FP8 / MXFP4 format (sliced reads of each rank's codes and scales); a prefix-cache hit
(`prefix_hit_matches_one_process`); then a killed worker (`kill_a_worker`).

The ranks' partial sums are all-reduced, which changes the float32 summation order against one
process's GEMMs: tokens must be equal, and each request's cumulative logprob (the sum of its
sampled tokens' logprobs) within LOGPROB_TOL per token."""

from __future__ import annotations

import os
import signal
import time

import pytest

from oracle import random_prompt, save_hf_checkpoint
from v4serve import LLM, SamplingParams
from v4serve.parallel.launch import RankDied

LOGPROB_TOL = 1e-4  # |cumulative logprob(TP) - (1 process)| / tokens, float32
PAGE = 32  # the tiny preset's page (= window) size
# 4 requests of up to 3 pages each share 6 pages (preemption), prompts above the 32-token step
# budget (chunked prefill), 2-4 running at once (decode batches, overlapped continuations).
TIGHT = dict(device="cpu", dtype="float32", max_num_seqs=4, max_model_len=3 * PAGE, num_kv_pages=6,
             max_num_batched_tokens=32, progress=False)
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)  # no top-N logprobs: decode may overlap


def generate(llm: LLM, prompts: list[list[int]]):
    return [o.outputs[0] for o in llm.generate(prompt_token_ids=prompts, sampling_params=PARAMS)]


def assert_same(reference, got) -> float:
    worst = 0.0
    for i, (a, b) in enumerate(zip(reference, got)):
        assert b.token_ids == a.token_ids, f"request {i}: TP tokens differ from one process"
        worst = max(worst, abs(a.cumulative_logprob - b.cumulative_logprob) / len(a.token_ids))
    assert worst <= LOGPROB_TOL, f"logprobs differ by {worst:.2e} > {LOGPROB_TOL}"
    return worst


def run_case(model: str, prompts: list[list[int]], reference, then=None, **extra):
    """TP2 with `extra` against `reference`; `then(llm)` runs before the workers stop."""
    llm = LLM(model, tensor_parallel_size=2, **TIGHT, **extra)
    try:
        got = generate(llm, prompts)
        engine = llm.engine
        assert engine.scheduler.num_preemptions > 0, "the test must exercise preemption"
        assert engine.decode_continuations > 0, "the test must exercise overlapped decode"
        worst = assert_same(reference, got)
        print(f"{model} tp2 {extra}: |d cumulative logprob| / token <= {worst:.2e}")
        if then is not None:
            then(llm)
    finally:
        llm.engine.runner.close()


def break_a_worker(llm: LLM) -> None:
    """A worker that raises reports its traceback, which the next step's error carries."""
    workers = llm.engine.runner.workers
    workers.send("no-such-step")
    workers.procs[0].join(30)  # a loaded machine may take a while to tear the worker down
    with pytest.raises(RankDied, match=r"(?s)rank 1 .* exited with code 1:.*unknown step kind 'no-such-step'"):
        generate(llm, [[6] * 10])


def kill_a_worker(llm: LLM) -> None:
    """A rank that dies stops the next generate at once with an error naming it (never a hang)."""
    worker = llm.engine.runner.workers.procs[0]
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(10)
    start = time.monotonic()
    with pytest.raises(RankDied, match=rf"tensor-parallel rank 1 \(pid {worker.pid}\) exited with code -9"):
        generate(llm, [[6] * 10])
    assert time.monotonic() - start < 5


TINY_PROMPTS = [[5 + i] * n for i, n in enumerate((60, 45, 50, 30))]
# Two prompts sharing two pages, run one after the other: the second reuses the first's pages and
# the snapshot at their end (prefix caching, on by default).
SHARED = random_prompt(2 * PAGE, seed=1)
PREFIX_PROMPTS = [SHARED + random_prompt(10, seed=2), SHARED + random_prompt(12, seed=3)]


@pytest.fixture(scope="module")
def tiny_reference():
    one = LLM("tiny", **TIGHT)
    out = generate(one, TINY_PROMPTS)
    assert one.engine.scheduler.num_preemptions > 0
    cold = LLM("tiny", enable_prefix_caching=False, **TIGHT)
    return out, [generate(cold, [p])[0] for p in PREFIX_PROMPTS]


def prefix_hit_matches_one_process(reference):
    """The second prompt hits the first's cached pages on every rank (their snapshots restored on
    each): the same tokens as one process without prefix caching."""

    def check(llm: LLM) -> None:
        prefix = llm.engine.cache.prefix
        got = [generate(llm, [PREFIX_PROMPTS[0]])[0]]
        hits = prefix.hits
        got.append(generate(llm, [PREFIX_PROMPTS[1]])[0])
        assert prefix.hits - hits == len(SHARED), "the second prompt must reuse the shared pages"
        assert_same(reference, got)

    return check


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "ep"])
def test_tiny_tp2_matches_one_process(tiny_reference, expert_parallel):
    reference, prefix_reference = tiny_reference
    hit = prefix_hit_matches_one_process(prefix_reference)
    then = kill_a_worker if expert_parallel else break_a_worker
    run_case("tiny", TINY_PROMPTS, reference, then=lambda llm: (hit(llm), then(llm)),
             enable_expert_parallel=expert_parallel)


@pytest.fixture(scope="module")
def oracle_checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("oracle_a")
    save_hf_checkpoint("a", path)  # transformers' save_pretrained: per-expert official names
    prompts = [random_prompt(n, seed=n) for n in (58, 41, 47, 33)]
    one = LLM(str(path), **TIGHT)
    return str(path), prompts, generate(one, prompts)


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "ep"])
def test_transformers_checkpoint_tp2_matches_one_process(oracle_checkpoint, expert_parallel):
    path, prompts, reference = oracle_checkpoint
    run_case(path, prompts, reference, enable_expert_parallel=expert_parallel)


@pytest.fixture(scope="module")
def quantized_checkpoint(quantized_tp_checkpoint):
    path = quantized_tp_checkpoint  # official FP8 / MXFP4 format (conftest.py)
    prompts = [random_prompt(n, seed=n) for n in (58, 41, 47, 33)]
    return path, prompts, generate(LLM(path, **TIGHT), prompts)


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "ep"])
def test_quantized_checkpoint_tp2_matches_one_process(quantized_checkpoint, expert_parallel):
    path, prompts, reference = quantized_checkpoint
    run_case(path, prompts, reference, enable_expert_parallel=expert_parallel)
