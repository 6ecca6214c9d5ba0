"""Sampling controls and structured outputs through the engine on the tiny preset (CPU): min_tokens
against a forced end of sequence, 100 schema-constrained requests, a regex and a choice, grammars
with n > 1 and overlapped decode steps."""

from __future__ import annotations

import json
import re

import pytest
import torch

from v4serve import LLM, SamplingParams
from v4serve.engine.sampling_params import StructuredOutputsParams

torch.set_num_threads(1)

EOS = 1  # the tiny preset's eos_token_id


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", device="cpu", max_model_len=256, max_num_seqs=100, progress=False,
               hf_overrides={"num_hidden_layers": 1})


def test_min_tokens_holds_a_forced_eos_back_exactly_that_long(llm):
    forced = {EOS: 100.0}  # EOS is the greedy token at every step
    for min_tokens in (0, 1, 5):
        out = llm.generate(["Hello"], SamplingParams(temperature=0.0, max_tokens=20, min_tokens=min_tokens,
                                                     logit_bias=forced))[0].outputs[0]
        assert out.token_ids[:-1] and EOS not in out.token_ids[:-1] if min_tokens else True
        assert len(out.token_ids) == min_tokens + 1 and out.token_ids[-1] == EOS
        assert out.finish_reason == "stop"
    # A stop token id is held back the same way (sampled rows too).
    out = llm.generate(["Hello"], SamplingParams(temperature=0.8, seed=1, max_tokens=20, min_tokens=3,
                                                 stop_token_ids=[77], logit_bias={77: 100.0}))[0].outputs[0]
    assert len(out.token_ids) == 4 and out.token_ids[-1] == 77 and out.stop_reason == 77


def test_logit_bias_ids_outside_the_vocabulary_are_refused(llm):
    with pytest.raises(ValueError, match="logit_bias"):
        llm.generate(["Hello"], SamplingParams(logit_bias={10**7: 1.0}))


SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 9},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2},
        "pos": {"type": "object", "properties": {"kind": {"enum": ["p", "q"]}, "ok": {"type": "boolean"}},
                "required": ["kind", "ok"], "additionalProperties": False},
    },
    "required": ["id", "tags", "pos"],
    "additionalProperties": False,
}


def _validate(value, schema, path="$") -> None:
    """The subset of JSON Schema that SCHEMA uses, checked by hand (jsonschema is not installed)."""
    if "enum" in schema:
        assert value in schema["enum"], path
        return
    kind = schema["type"]
    if kind == "object":
        assert isinstance(value, dict), path
        assert set(schema.get("required", [])) <= set(value), path
        assert set(value) <= set(schema["properties"]), path
        for key, item in value.items():
            _validate(item, schema["properties"][key], f"{path}.{key}")
    elif kind == "array":
        assert isinstance(value, list) and len(value) <= schema.get("maxItems", len(value)), path
        for i, item in enumerate(value):
            _validate(item, schema["items"], f"{path}[{i}]")
    elif kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), path
        assert schema.get("minimum", value) <= value <= schema.get("maximum", value), path
    elif kind == "boolean":
        assert isinstance(value, bool), path


def test_one_hundred_schema_requests_all_return_valid_json(llm):
    structured = StructuredOutputsParams(json=SCHEMA)
    prompts = [f"Record {i}:" for i in range(100)]
    params = [SamplingParams(temperature=0.0 if i % 2 else 1.0, seed=i, max_tokens=60, structured_outputs=structured)
              for i in range(100)]
    before = llm.engine.decode_continuations
    outputs = llm.generate(prompts, params)
    assert llm.engine.decode_continuations > before  # grammar rows ran in overlapped decode steps
    texts = set()
    for out in outputs:
        c = out.outputs[0]
        assert c.finish_reason == "stop" and c.token_ids[-1] == EOS, c.text
        _validate(json.loads(c.text), SCHEMA)
        texts.add(c.text)
    assert len(texts) > 10  # not one answer forced on all


def test_the_validator_rejects_what_the_schema_does_not_allow():
    for bad in ({"id": 10, "tags": [], "pos": {"kind": "p", "ok": True}},
                {"id": 1, "tags": [True, True, True], "pos": {"kind": "p", "ok": True}},
                {"id": 1, "tags": [], "pos": {"kind": "r", "ok": True}},
                {"id": 1, "tags": []}):
        with pytest.raises(AssertionError):
            _validate(bad, SCHEMA)


def test_regex_and_choice_with_n_greater_than_one(llm):
    regex = StructuredOutputsParams(regex=r"[a-z]{2,4}-[0-9]{3}")
    out = llm.generate(["Code:"], SamplingParams(n=4, temperature=1.0, seed=5, max_tokens=20,
                                                 structured_outputs=regex))[0]
    assert len(out.outputs) == 4
    for c in out.outputs:
        assert re.fullmatch(r"[a-z]{2,4}-[0-9]{3}", c.text), c.text
    choices = ["yes", "no", "maybe later"]
    out = llm.generate(["Answer:"], SamplingParams(n=6, temperature=1.0, seed=2, max_tokens=20,
                                                   structured_outputs=StructuredOutputsParams(choice=choices)))[0]
    assert all(c.text in choices and c.finish_reason == "stop" for c in out.outputs)


def test_a_grammar_that_allows_the_greedy_tokens_changes_nothing(llm):
    from free_run_grammar import allowing_grammar

    free = llm.generate(["Hello there"], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    tokens = free.outputs[0].token_ids
    grammar, m = allowing_grammar(llm.engine.structured, llm.engine.tokenizer, tokens)
    assert m >= 8, f"the grammar accepts only {m} of the free tokens"
    constrained = llm.generate(["Hello there"], SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True, structured_outputs=grammar))[0]
    assert constrained.outputs[0].token_ids[:m] == tokens[:m]


def test_a_grammar_of_the_decoded_text_refuses_a_partial_character(llm):
    """Why the grammar above is built from the tokens: the H200 run wrote token 731 (bytes E6 8C, a
    partial UTF-8 character) as its 23rd token; its text ends in U+FFFD, and `re.escape(text)`
    then refuses 731 and allows 2779 (bytes EF BF, the start of U+FFFD), which greedy took."""
    from free_run_grammar import allowing_grammar

    structured, tokenizer = llm.engine.structured, llm.engine.tokenizer
    tokens = [73169, 11621, 731]
    assert tokenizer.decode(tokens).endswith("\ufffd")
    naive = structured.matcher(StructuredOutputsParams(regex=re.escape(tokenizer.decode(tokens)) + ".*"))
    assert naive.accept_token(73169) and naive.accept_token(11621)
    allowed = naive.fill_next_token_bitmask  # the engine's mask of the next step
    mask = torch.full((1, structured.words), -1, dtype=torch.int32)
    allowed(mask, 0)
    bit = lambda t: bool((int(mask[0, t // 32]) >> (t % 32)) & 1)  # noqa: E731
    assert not bit(731) and bit(2779)
    _, m = allowing_grammar(structured, tokenizer, tokens)
    assert m == 3  # the clean prefix's grammar accepts the partial character as the start of "anything"


def test_bad_constraints_name_the_field():
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(json={"type": "object"}, regex="a")
    with pytest.raises(ValueError, match="choice"):
        StructuredOutputsParams(choice=[])
    from v4serve.engine.structured_output import check_structured_outputs

    with pytest.raises(ValueError, match="^guided_regex: not a valid regex"):
        check_structured_outputs(StructuredOutputsParams(regex="(unclosed"), "guided_regex")


def test_penalties_see_the_tokens_of_overlapped_steps(llm):
    """Penalized greedy decoding gives the same tokens with and without overlapped decode steps
    (where the previous token is known only on the device when the next step samples), and the
    penalties change what is generated."""
    # logit_bias makes token 77 the greedy pick; the penalties must take it away once it repeats.
    params = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, repetition_penalty=1.2,
                             frequency_penalty=1.0, presence_penalty=0.5, logit_bias={77: 8.0}),
              SamplingParams(temperature=0.7, seed=9, max_tokens=16, ignore_eos=True, frequency_penalty=1.5)]
    prompts = ["Hello there", "Once upon a time"]
    plain = LLM("tiny", device="cpu", max_model_len=256, progress=False, hf_overrides={"num_hidden_layers": 1},
                overlap_decode=False).generate(prompts, params)
    before = llm.engine.decode_continuations
    overlapped = llm.generate(prompts, params)
    assert llm.engine.decode_continuations > before
    assert [o.outputs[0].token_ids for o in overlapped] == [o.outputs[0].token_ids for o in plain]
    free = llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True,
                                                    logit_bias={77: 8.0}))[0].outputs[0].token_ids
    penalized = plain[0].outputs[0].token_ids
    assert free.count(77) == 16 and 1 <= penalized.count(77) < 16, (free, penalized)


def test_min_tokens_does_not_hold_back_the_end_of_a_finished_grammar(llm):
    """After "yes" the choice grammar allows only end-of-sequence, which min_tokens would mask:
    the grammar wins (no row is left without a token)."""
    for temperature in (0.0, 1.0):
        out = llm.generate(["Answer:"], SamplingParams(
            temperature=temperature, seed=3, max_tokens=10, min_tokens=6,
            structured_outputs=StructuredOutputsParams(choice=["yes"])))[0].outputs[0]
        assert out.text == "yes" and out.token_ids[-1] == EOS and out.finish_reason == "stop"
