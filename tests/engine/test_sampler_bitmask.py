"""The token-bitmask op: torch reference and Triton kernel (interpreted on the CPU) against a
bit-by-bit Python oracle, and against xgrammar's own fill on a real grammar."""

from __future__ import annotations

import math

import pytest
import torch

from v4serve.ops.token_bitmask import apply_token_bitmask


def _oracle(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    out = logits.clone()
    words = bitmask.tolist()
    for b in range(logits.shape[0]):
        for t in range(logits.shape[1]):
            if not (words[b][t // 32] & 0xFFFFFFFF) >> (t % 32) & 1:
                out[b, t] = -math.inf
    return out


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("V", [1, 31, 32, 100, 2100])
def test_bitmask_masks_exactly_the_clear_bits(impl, V):
    g = torch.Generator().manual_seed(V)
    W = -(-V // 32) + (1 if V == 100 else 0)  # a wider mask than needed is fine
    logits = torch.randn(3, V, generator=g)
    bitmask = torch.randint(-2**31, 2**31, (3, W), generator=g, dtype=torch.int64).to(torch.int32)
    bitmask[1] = -1  # all allowed
    bitmask[2, 0] = 0  # the first 32 blocked
    expected = _oracle(logits, bitmask)
    got = apply_token_bitmask(logits.clone(), bitmask, impl=impl)
    assert torch.equal(got, expected)


def test_bitmask_works_on_strided_rows_and_bf16():
    logits = torch.randn(2, 200).to(torch.bfloat16)
    view = torch.zeros(2, 256, dtype=torch.bfloat16)[:, :200]
    view.copy_(logits)
    bitmask = torch.tensor([[0x55555555] * 7, [-1] * 6 + [0]], dtype=torch.int32)
    expected = _oracle(logits.float(), bitmask).to(torch.bfloat16)
    for impl in ("torch", "triton"):
        got = apply_token_bitmask(view.clone(), bitmask, impl=impl)
        assert torch.equal(got, expected)


def test_bad_shapes_name_what_is_wrong():
    with pytest.raises(ValueError, match="int32"):
        apply_token_bitmask(torch.zeros(1, 64), torch.zeros(1, 1, dtype=torch.int32))


def test_xgrammar_fill_and_the_op_agree_on_allowed_tokens():
    xgr = pytest.importorskip("xgrammar")
    vocab = ["a", "b", "ab", "1", "12", "x", "</s>"]
    info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=40, stop_token_ids=[6])
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_grammar('root ::= "a" [0-9]+')
    matcher = xgr.GrammarMatcher(compiled)
    mask = torch.full((1, 2), -1, dtype=torch.int32)
    matcher.fill_next_token_bitmask(mask, 0)
    allowed = apply_token_bitmask(torch.zeros(1, 40), mask, impl="triton")[0] == 0
    assert allowed.nonzero().flatten().tolist() == [0]  # only "a" starts the grammar
    assert matcher.accept_token(0)
    matcher.fill_next_token_bitmask(mask, 0)
    allowed = apply_token_bitmask(torch.zeros(1, 40), mask, impl="torch")[0] == 0
    assert allowed.nonzero().flatten().tolist() == [3, 4]
