"""The sampler and structured outputs on the GPU (not run on the CPU CI; `pytest -m gpu`)."""

from __future__ import annotations

import pytest
import torch

from v4serve import LLM, SamplingParams
from v4serve.ops.token_bitmask import apply_token_bitmask

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitmask_kernel_matches_the_reference_at_full_vocab(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    V = 129280
    logits = torch.randn(64, V, device="cuda", generator=g).to(dtype)
    bitmask = torch.randint(-2**31, 2**31, (64, -(-V // 32)), device="cuda", generator=g,
                            dtype=torch.int64).to(torch.int32)
    a = apply_token_bitmask(logits.clone(), bitmask, impl="triton")
    b = apply_token_bitmask(logits.clone(), bitmask, impl="torch")
    assert torch.equal(a, b)


def test_cuda_graph_decode_gives_the_same_tokens_with_a_grammar_that_allows_them():
    """Greedy decode replayed from CUDA graphs, overlapped, with n > 1 rows in the batch: a grammar
    that allows what the free run wrote (then anything) changes no token the grammar accepts.

    The grammar is built from the run's tokens (`free_run_grammar.py`), not from `re.escape(text)`:
    the random model writes partial UTF-8 characters, whose U+FFFD in the text the grammar then
    demands (the first H200 run parted at token 22 of 24 that way: 731, bytes E6 8C, refused;
    2779, bytes EF BF, the start of U+FFFD, taken). Compared: the first M tokens of every request,
    M the fewest any request's grammar accepts, so every step compared ran the same batches as
    the free run (bf16: a different batch could round differently)."""
    from free_run_grammar import allowing_grammar

    llm = LLM("tiny", device="cuda", dtype="bfloat16", max_num_seqs=4, progress=False)
    assert llm.engine.decode_runner.uses_cuda_graphs
    prompts = ["Hello there", "The capital of France is", "1, 2, 3,"]
    free = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    grammars = [allowing_grammar(llm.engine.structured, llm.engine.tokenizer, out.outputs[0].token_ids)
                for out in free]
    m = min(n for _, n in grammars)
    assert m >= 8, f"the grammars accept only {m} of the free tokens: too few to compare"
    params = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, structured_outputs=g)
              for g, _ in grammars]
    before = llm.engine.decode_continuations
    constrained = llm.generate(prompts, params)
    assert llm.engine.decode_continuations > before  # the grammar rows ran in overlapped steps
    for a, b in zip(free, constrained):
        assert a.outputs[0].token_ids[:m] == b.outputs[0].token_ids[:m]


def test_penalties_on_the_gpu_match_the_cpu():
    from v4serve.engine.sampler import Sampler

    class Row:
        def __init__(self, params, slot):
            self.params, self.slot, self.seed = params, slot, slot
            self.prompt_token_ids, self.output_token_ids = [3, 4, 4, 7], [5, 5, 9]

    rows = [Row(SamplingParams(repetition_penalty=1.4, frequency_penalty=0.5, presence_penalty=0.3,
                               logit_bias={1: 3.0}, min_tokens=5), 0), Row(SamplingParams(), 1)]
    logits = torch.randn(2, 1000)
    cpu, _ = Sampler(1000, 4, (1,), torch.device("cpu")).process(logits, rows)
    gpu, _ = Sampler(1000, 4, (1,), torch.device("cuda")).process(logits.cuda(), rows)
    assert torch.allclose(cpu, gpu.cpu(), atol=1e-6)
