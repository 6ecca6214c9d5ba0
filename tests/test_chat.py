"""v4serve.chat: the reference vectors byte for byte and token by token, parse-back of every
assistant turn, streaming == one-shot parsing, malformed completions, input validation, and
`LLM.chat` offline."""

import ast
import itertools
import json
import os
import random
import sys
from pathlib import Path

import pytest

import v4serve.chat
from v4serve import LLM, SamplingParams
from v4serve.chat import (
    ParsedCompletion, StreamingParser, collect_deltas, encode_messages, parse_completion,
)
from v4serve.chat.tokens import (
    ASSISTANT, BOS, DSML, EOS, LATEST_REMINDER, REASONING_EFFORT_PREFIX, TASK_TOKENS, THINK_END,
    THINK_START, USER,
)
from v4serve.tokenizer import Tokenizer

_VECTOR_DIRS = [
    os.environ.get("V4SERVE_CHAT_VECTORS", ""),
    Path(__file__).resolve().parent / "data/chat_encoding",
]
CASES = [1, 2, 3]


def load_case(n: int) -> tuple[list[dict], str]:
    """(messages, expected prompt); case 1's top-level tools go on its first message."""
    folder = next((Path(d) for d in _VECTOR_DIRS if d and Path(d, "case_1.input.json").exists()),
                  None)
    if folder is None:
        raise FileNotFoundError("chat-encoding vectors not found in tests/data/chat_encoding")
    data = json.loads((folder / f"case_{n}.input.json").read_text(encoding="utf-8"))
    expected = (folder / f"case_{n}.expected.txt").read_text(encoding="utf-8")
    if isinstance(data, dict):
        messages = data["messages"]
        messages[0]["tools"] = data["tools"]
        return messages, expected
    return data, expected


def counter_ids():
    count = itertools.count()
    return lambda: f"call_{next(count)}"


def assistant_completions(prompt: str) -> list[tuple[str, str]]:
    """(mode, completion) per assistant turn: `<think>` opened reasoning, `</think>` did not."""
    out = []
    for piece in prompt.split(ASSISTANT)[1:]:
        body = piece.split(EOS)[0]
        if body.startswith(THINK_START):
            out.append(("thinking", body[len(THINK_START):]))
        else:
            assert body.startswith(THINK_END), body[:40]
            out.append(("chat", body[len(THINK_END):]))
    return out


def calls_of(tool_calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls]


# ---- encoding -----------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_vector_encodes_byte_for_byte(case):
    messages, expected = load_case(case)
    assert encode_messages(messages, thinking_mode="thinking") == expected


SPECIAL_TOKENS = [BOS, EOS, USER, ASSISTANT, LATEST_REMINDER, THINK_START, THINK_END, DSML,
                  *TASK_TOKENS.values()]


@pytest.mark.parametrize("case", CASES)
def test_vector_special_tokens_are_single_ids(case):
    """The model was trained on each special token as one id; split into pieces (a tokenizer
    without them), the same text would be a prompt it has never seen."""
    _, expected = load_case(case)
    tokenizer = Tokenizer.for_model(None)
    ids = tokenizer.encode(expected)
    assert tokenizer.decode(ids, skip_special_tokens=False) == expected
    assert ids[0] == tokenizer.token_to_id(BOS)
    for token in SPECIAL_TOKENS:
        token_id = tokenizer.token_to_id(token)
        assert token_id is not None, token
        assert ids.count(token_id) == expected.count(token), token


def test_tools_argument_equals_tools_on_system_message():
    messages, expected = load_case(1)
    tools = messages[0].pop("tools")
    assert encode_messages(messages, "thinking", tools=tools) == expected


def test_tools_argument_without_system_message_creates_one():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    user = {"role": "user", "content": "hi"}
    got = encode_messages([user], "chat", tools=tools)
    explicit = encode_messages([{"role": "system", "content": "", "tools": tools}, user], "chat")
    assert got == explicit
    assert got.startswith(BOS + "\n\n## Tools\n\n")
    assert got.endswith('{"name": "f", "parameters": {}}\n\nYou MUST strictly follow the above '
                        "defined tool name and parameter schemas to invoke tool calls.\n"
                        "<｜User｜>hi<｜Assistant｜></think>")


S, U = {"role": "system", "content": "S"}, {"role": "user", "content": "u"}
A = {"role": "assistant", "reasoning_content": "r", "content": "a"}


@pytest.mark.parametrize("messages, mode, kwargs, expected", [
    ([U], "chat", {}, "<｜User｜>u<｜Assistant｜></think>"),
    ([U], "thinking", {}, "<｜User｜>u<｜Assistant｜><think>"),
    ([S, U, A, U], "chat", {},
     "S<｜User｜>u<｜Assistant｜></think>a<｜end▁of▁sentence｜><｜User｜>u<｜Assistant｜></think>"),
    ([S, U, A, U], "thinking", {},
     "S<｜User｜>u<｜Assistant｜></think>a<｜end▁of▁sentence｜><｜User｜>u<｜Assistant｜><think>"),
    ([S, U, A, U], "thinking", {"drop_thinking": False},
     "S<｜User｜>u<｜Assistant｜><think>r</think>a<｜end▁of▁sentence｜>"
     "<｜User｜>u<｜Assistant｜><think>"),
    ([S, {"role": "latest_reminder", "content": "R"}, U], "chat", {},
     "S<｜latest_reminder｜>R<｜User｜>u<｜Assistant｜></think>"),
    ([{"role": "developer", "content": "D"}, U], "thinking", {},
     "<｜User｜>u<｜Assistant｜><think>"),  # developer before the last user: dropped
    ([{"role": "developer", "content": "D"}, U], "chat", {},
     "<｜User｜>D<｜User｜>u<｜Assistant｜></think>"),
    ([U, U], "chat", {}, "<｜User｜>u\n\nu<｜Assistant｜></think>"),
    ([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
     "chat", {}, "<｜User｜>ab<｜Assistant｜></think>"),
    ([{**U, "task": "query"}], "chat", {}, "<｜User｜>u<｜query｜>"),
    ([{**U, "task": "query"}, U], "chat", {}, "<｜User｜>u<｜User｜>u<｜Assistant｜></think>"),
    ([{**U, "task": "action"}], "thinking", {}, "<｜User｜>u<｜Assistant｜><think><｜action｜>"),
    ([{**U, "task": "action"}, A], "thinking", {},
     "<｜User｜>u<｜Assistant｜><think><｜action｜>a<｜end▁of▁sentence｜>"),
    ([U, {**A, "task": "title"}], "chat", {},
     "<｜User｜>u<｜Assistant｜></think>a<｜end▁of▁sentence｜><｜title｜>"),
    ([S, U], "chat", {"reasoning_effort": "max"}, "S<｜User｜>u<｜Assistant｜></think>"),
    ([S, U], "thinking", {"reasoning_effort": "high"}, "S<｜User｜>u<｜Assistant｜><think>"),
    ([S, U], "thinking", {"reasoning_effort": "max"},
     REASONING_EFFORT_PREFIX["max"] + "S<｜User｜>u<｜Assistant｜><think>"),
])
def test_encoding_rules(messages, mode, kwargs, expected):
    assert encode_messages(messages, mode, **kwargs) == BOS + expected


def test_max_effort_text_opens_the_prompt():
    prompt = encode_messages([S, U], "thinking", reasoning_effort="max")
    assert prompt.startswith(BOS + "Reasoning Effort: Absolute maximum with no shortcuts "
                             "permitted.\nYou MUST be very thorough")
    assert prompt.endswith("no assumption is left unchecked.\n\nS<｜User｜>u<｜Assistant｜><think>")


def _call(call_id, name, arguments):
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_tool_results_merge_in_call_order():
    messages = [
        U,
        {"role": "assistant", "content": "", "tool_calls": [
            _call("c1", "f", {"x": 1}), _call("c2", "g", {"y": "two"})]},
        {"role": "tool", "tool_call_id": "c2", "content": "G"},
        {"role": "tool", "tool_call_id": "c1", "content": "F"},
        {"role": "user", "content": "thanks"},
    ]
    prompt = encode_messages(messages, "chat")
    assert prompt.endswith(
        '<｜DSML｜parameter name="y" string="true">two</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        "</｜DSML｜tool_calls><｜end▁of▁sentence｜><｜User｜><tool_result>F</tool_result>\n\n"
        "<tool_result>G</tool_result>\n\nthanks<｜Assistant｜></think>")


TYPED_ARGUMENTS = {"q": "caf\u00e9 \"x\"\nline2", "n": 3, "ratio": 0.5, "flag": True,
                   "items": [1, "a", None], "obj": {"k": {"deep": []}}, "digits": "42",
                   "nothing": None}


def test_typed_arguments_encode_as_dsml_and_parse_back():
    call = _call("c1", "lookup", TYPED_ARGUMENTS)
    assistant = {"role": "assistant", "reasoning_content": "plan", "content": "Looking.",
                 "tool_calls": [call, _call("c2", "noargs", {})]}
    prompt = encode_messages([U, assistant], "thinking", drop_thinking=False)
    assert '<｜DSML｜parameter name="n" string="false">3</｜DSML｜parameter>' in prompt
    assert '<｜DSML｜parameter name="digits" string="true">42</｜DSML｜parameter>' in prompt
    assert '<｜DSML｜parameter name="flag" string="false">true</｜DSML｜parameter>' in prompt
    [(mode, completion)] = assistant_completions(prompt)
    parsed = parse_completion(completion, mode, tool_names={"lookup", "noargs"})
    assert parsed.error is None
    assert (parsed.reasoning_content, parsed.content) == ("plan", "Looking.")
    assert calls_of(parsed.tool_calls) == [("lookup", TYPED_ARGUMENTS), ("noargs", {})]


def test_llm_chat_offline_with_tools_and_thinking():
    """`LLM.chat` prompts with the thinking-mode encoding and the tools, then generates as usual."""
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    prompt = encode_messages([U], "thinking", tools=tools)
    assert "## Tools" in prompt and prompt.endswith(ASSISTANT + THINK_START)
    llm = LLM("tiny", device="cpu", max_num_seqs=2)
    params = SamplingParams(temperature=0, max_tokens=4)
    [out] = llm.chat([U], params, tools=tools, thinking=True)
    assert out.prompt_token_ids == llm.tokenizer.encode(prompt)
    assert out.outputs[0].token_ids == llm.generate(prompt, params)[0].outputs[0].token_ids


# ---- input validation ---------------------------------------------------------------------

def _assistant_call(function):
    return [U, {"role": "assistant", "tool_calls": [{"type": "function", "function": function}]}]


@pytest.mark.parametrize("messages, kwargs, field", [
    ([], {}, r"^messages:"),
    ([{"role": "wizard", "content": "x"}], {}, r"messages\[0\]\.role"),
    ([S, {"role": "user"}], {}, r"messages\[1\]\.content: missing"),
    ([S, {"role": "user", "content": 5}], {}, r"messages\[1\]\.content"),
    ([U, {"role": "assistant", "reasoning_content": "r"}], {}, r"messages\[1\]\.content"),
    ([{"role": "tool", "tool_call_id": "c"}], {}, r"messages\[0\]\.content"),
    ([{"role": "developer", "content": ""}], {}, r"messages\[0\]\.content"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], {}, r"messages\[0\]\.content\[0\]"),
    (_assistant_call({"arguments": "{}"}), {}, r"messages\[1\]\.tool_calls\[0\]\.function\.name"),
    (_assistant_call({"name": "f", "arguments": "{oops"}), {},
     r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"),
    (_assistant_call({"name": "f", "arguments": "[1, 2]"}), {},
     r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"),
    ([U, {"role": "assistant", "tool_calls": [{"type": "function"}]}], {},
     r"messages\[1\]\.tool_calls\[0\]\.function"),
    ([U, {"role": "assistant", "content": "", "tool_calls": "f()"}], {},
     r"messages\[1\]\.tool_calls"),
    ([{**U, "task": "summarize"}], {}, r"messages\[0\]\.task"),
    ([{**U, "tools": []}], {}, r"messages\[0\]\.tools"),
    ([{**S, "tools": [{"type": "function"}]}], {}, r"messages\[0\]\.tools\[0\]\.function"),
    ([U], {"tools": [{"type": "function", "function": {"name": ""}}]},
     r"tools\[0\]\.function\.name"),
    ([{**S, "tools": [{"type": "function", "function": {"name": "f"}}]}, U],
     {"tools": [{"type": "function", "function": {"name": "g"}}]}, r"messages\[0\]\.tools"),
    ([U], {"thinking_mode": "deep"}, r"thinking_mode"),
    ([U], {"reasoning_effort": "extreme"}, r"reasoning_effort"),
])
def test_invalid_input_names_the_field(messages, kwargs, field):
    with pytest.raises(ValueError, match=field):
        encode_messages(messages, **kwargs)


# ---- parsing ------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES)
def test_every_assistant_turn_parses_back(case):
    messages, expected = load_case(case)
    assistants = [m for m in messages if m["role"] == "assistant"]
    completions = assistant_completions(expected)
    assert len(completions) == len(assistants)
    for msg, (mode, completion) in zip(assistants, completions):
        parsed = parse_completion(completion, mode, id_factory=counter_ids())
        kept_reasoning = msg.get("reasoning_content") or "" if mode == "thinking" else None
        assert parsed.error is None
        assert parsed.reasoning_content == kept_reasoning
        assert parsed.content == (msg.get("content") or "")
        assert calls_of(parsed.tool_calls) == calls_of(msg.get("tool_calls") or [])


RAW_CALL = ('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="search">\n'
            '<｜DSML｜parameter name="q" string="true">{q}</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="k" string="false">{k}</｜DSML｜parameter>\n'
            '</｜DSML｜invoke>\n</｜DSML｜tool_calls>')
GOOD_BLOCK = RAW_CALL.format(q="weather", k="5")

MALFORMED = {
    "unclosed block": (GOOD_BLOCK[:-30], "not closed"),
    "bad json value": (RAW_CALL.format(q="w", k="{five"), "not JSON"),
    "unknown tool": (GOOD_BLOCK.replace('"search"', '"delete_all"'), "unknown tool"),
    "junk in block": ("<｜DSML｜tool_calls>\nsearch(q)\n</｜DSML｜tool_calls>", "expected"),
    "empty block": ("<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>", "no invoke"),
    "duplicate parameter": (RAW_CALL.format(q="a", k="1").replace('"k"', '"q"'), "twice"),
    "unclosed parameter": (GOOD_BLOCK.replace("weather</｜DSML｜parameter>", "weather"),
                           "'q' is not closed"),
    "unclosed last parameter": (GOOD_BLOCK.replace("5</｜DSML｜parameter>", "5"),
                                "'k' is not closed"),
    "bad string flag": (GOOD_BLOCK.replace('string="false"', 'string="no"'),
                        "expected a parameter"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_block_comes_back_as_content(name):
    block, reason = MALFORMED[name]
    answer = "Let me look.\n\n" + block
    for stream in (False, True):
        parsed = parse_both("Reasoning.</think>" + answer, "thinking", {"search"})[stream]
        assert parsed.reasoning_content == "Reasoning."
        assert parsed.content == answer
        assert parsed.tool_calls == []
        assert reason in parsed.error


def test_valid_block_kept_when_a_later_block_is_malformed():
    text = "a\n\n" + GOOD_BLOCK + "b\n\n" + MALFORMED["bad json value"][0]
    parsed = parse_completion(text, "chat", id_factory=counter_ids())
    assert calls_of(parsed.tool_calls) == [("search", {"q": "weather", "k": 5})]
    assert parsed.content == "ab\n\n" + MALFORMED["bad json value"][0]
    assert "not JSON" in parsed.error


def test_tool_call_shape_and_ids():
    parsed = parse_completion("\n\n" + GOOD_BLOCK, "chat", id_factory=counter_ids())
    assert parsed == ParsedCompletion(None, "", [{
        "id": "call_0", "type": "function",
        "function": {"name": "search", "arguments": '{"q": "weather", "k": 5}'}}], None)
    assert parsed.to_message() == {"role": "assistant", "content": None,
                                   "tool_calls": parsed.tool_calls}
    ids = [parse_completion(GOOD_BLOCK, "chat").tool_calls[0]["id"] for _ in range(2)]
    assert ids[0] != ids[1] and all(i.startswith("call_") and len(i) > 12 for i in ids)


def test_unterminated_reasoning_is_all_reasoning():
    parsed = parse_completion("still thinking <｜DSML｜tool_calls>", "thinking")
    assert parsed == ParsedCompletion("still thinking <｜DSML｜tool_calls>", "", [], None)


# ---- streaming ----------------------------------------------------------------------------

def parse_both(text, mode, tool_names=None, pieces=None):
    """(one-shot, streamed) results for one text; streamed in the given pieces (default 1 char)."""
    once = parse_completion(text, mode, tool_names, id_factory=counter_ids())
    parser = StreamingParser(mode, tool_names, id_factory=counter_ids())
    deltas = [d for piece in (pieces or list(text)) for d in parser.feed(piece)]
    last, error = parser.finish()
    return once, collect_deltas(deltas + last, mode, error)


def random_pieces(text: str, seed: int) -> list[str]:
    rng, pieces, pos = random.Random(seed), [], 0
    while pos < len(text):
        size = rng.randint(1, 9)
        pieces.append(text[pos:pos + size])
        pos += size
    return pieces


def streaming_samples() -> list[tuple[str, str]]:
    samples = []
    for case in CASES:
        samples += assistant_completions(load_case(case)[1])
    samples += [("thinking", "r</think>" + MALFORMED[name][0]) for name in MALFORMED]
    samples += [
        ("thinking", "no end yet </thi"),
        ("thinking", "a </thin k> b</think>c \n\n<｜DS not a block <｜DSML｜tool_callz>\n\n"),
        ("chat", "x\n\n\n\n" + GOOD_BLOCK + "\n\ny\n\n" + GOOD_BLOCK.replace("5", "[1, 2]")),
        ("chat", "ends with a partial marker \n\n<｜DSML｜tool_"),
        ("chat", ""),
    ]
    return samples


@pytest.mark.parametrize("seed", [None, 0, 1, 2, 3])
def test_streaming_equals_one_shot(seed):
    samples = streaming_samples()
    for mode, text in samples:
        pieces = None if seed is None else random_pieces(text, seed)
        once, streamed = parse_both(text, mode, {"search"}, pieces)
        assert streamed == once, (mode, text)
    assert any(once.tool_calls for once, _ in (parse_both(t, m) for m, t in samples))


def test_streaming_emits_early_and_holds_back_markers():
    parser = StreamingParser("thinking", id_factory=counter_ids())
    assert parser.feed("I will search.</thi") == [{"reasoning_content": "I will search."}]
    assert parser.feed("nk>Sure") == [{"content": "Sure"}]
    assert parser.feed(".\n\n<｜DS") == [{"content": "."}]
    assert parser.feed("x") == [{"content": "\n\n<｜DSx"}]
    assert parser.feed("\n\n" + GOOD_BLOCK[:-1]) == []
    [delta] = parser.feed(GOOD_BLOCK[-1])
    assert delta == {"tool_calls": [{"index": 0, "id": "call_0", "type": "function", "function": {
        "name": "search", "arguments": '{"q": "weather", "k": 5}'}}]}
    assert parser.finish() == ([], None)


def test_chat_imports_only_the_standard_library():
    """Layering: chat sits below the server and beside the engine; it imports neither."""
    for path in Path(v4serve.chat.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                stdlib = name.split(".")[0] in sys.stdlib_module_names
                assert stdlib or name.startswith("v4serve.chat"), f"{path.name} imports {name}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
