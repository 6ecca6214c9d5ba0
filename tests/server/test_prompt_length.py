"""The character bound on token counts (v4serve/server/prompt_length.py) against the real
tokenizer: it never claims more tokens than tokenizing gives, and it is tight on the worst case."""

from __future__ import annotations

import json

import pytest

from v4serve.server.errors import APIError
from v4serve.chat import encode_messages
from v4serve.server.prompt_length import PromptLimit, max_chars_per_token, rendered_content_chars
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


@pytest.fixture(scope="module")
def limit(tokenizer) -> PromptLimit:
    return PromptLimit.for_tokenizer(tokenizer.file, max_model_len=4096)


def test_longest_entry_of_the_deepseek_tokenizer(limit):
    assert limit.max_chars_per_token == 128


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_the_bound_never_exceeds_the_token_count(tokenizer, limit, text):
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


def test_message_content_is_a_lower_bound_of_the_encoded_prompt():
    """Every content the bound counts is in the prompt, in both modes (thinking drops earlier
    reasoning and developer messages: the bound counts neither)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    conversations = [
        [{"role": "user", "content": "hello there"}],
        [{"role": "system", "content": "be brief"}, {"role": "developer", "content": "dev " * 50},
         {"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "two"}]},
         {"role": "assistant", "content": "answer " * 20, "reasoning_content": "thought " * 40},
         {"role": "user", "content": "again"}],
        [{"role": "user", "content": "call it"},
         {"role": "assistant", "content": "", "tool_calls": [
             {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "c", "content": "result " * 30},
         {"role": "latest_reminder", "content": "remember"}, {"role": "user", "content": "done?"}],
    ]
    for messages in conversations:
        for mode in ("chat", "thinking"):
            for tools in (None, [tool]):
                prompt = encode_messages(messages, mode, tools=tools)
                assert 0 < rendered_content_chars(messages) <= len(prompt)
    assert rendered_content_chars(conversations[1]) == len("be brief") + len("part one two") + 7 * 20 + len("again")
