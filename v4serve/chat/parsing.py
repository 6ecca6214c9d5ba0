"""DeepSeek-V4 completion text to OpenAI `reasoning_content`, `content` and `tool_calls`.

The completion is what the model wrote after the prompt, up to but excluding EOS:

    thinking mode:  {reasoning}</think>{content}[\\n\\n{tool-call block}]
    chat mode:      {content}[\\n\\n{tool-call block}]

    tool-call block: <｜DSML｜tool_calls>\\n<｜DSML｜invoke ...>...</｜DSML｜tool_calls> (see dsml)

A thinking-mode completion without `</think>` (cut off while reasoning) is all reasoning. A
tool-call block that does not parse (unclosed, bad structure, a `string="false"` value that is
not JSON, a tool not in `tool_names`) is returned verbatim as content and `error` says why;
parsing never raises. Text after a closed block is content again.

`parse_completion` parses a whole text; `StreamingParser` gives the same result as deltas while
the text arrives (see its docstring). Both write to `ParsedCompletion`.
"""

import uuid
from dataclasses import dataclass, field
from typing import Callable

from v4serve.chat.dsml import parse_tool_block
from v4serve.chat.messages import check_thinking_mode
from v4serve.chat.tokens import THINK_END, TOOL_CALLS_END, TOOL_CALLS_SEPARATOR, TOOL_CALLS_START


def random_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class ParsedCompletion:
    """One assistant completion as OpenAI message fields."""
    reasoning_content: str | None = None  # None in chat mode
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)  # OpenAI tool_calls
    error: str | None = None  # why part of the text was returned as content

    def to_message(self) -> dict:
        """The OpenAI assistant message (content is None when empty and tools were called)."""
        msg = {"role": "assistant", "content": self.content or (None if self.tool_calls else "")}
        if self.reasoning_content is not None:
            msg["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg


def tool_call(name: str, arguments: str, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def parse_completion(text: str, thinking_mode: str, tool_names=None,
                     id_factory: Callable[[], str] = random_call_id) -> ParsedCompletion:
    """Parse a whole completion. `tool_names`: the known tools (None accepts any name);
    `id_factory`: makes tool-call ids (random `call_...` by default)."""
    check_thinking_mode(thinking_mode)
    out = ParsedCompletion()
    if thinking_mode == "thinking":
        out.reasoning_content, found, text = text.partition(THINK_END)
        if not found:
            return out
    content = []
    while (start := text.find(TOOL_CALLS_START)) >= 0:
        before = text[:start]
        sep = TOOL_CALLS_SEPARATOR if before.endswith(TOOL_CALLS_SEPARATOR) else ""
        content.append(before[:len(before) - len(sep)])
        end = text.find(TOOL_CALLS_END, start)
        if end < 0:
            content.append(sep + text[start:])
            out.error = out.error or "tool_calls block is not closed"
            text = ""
            break
        end += len(TOOL_CALLS_END)
        calls, error = parse_tool_block(text[start:end], tool_names)
        if error:
            content.append(sep + text[start:end])
            out.error = out.error or error
        out.tool_calls += [tool_call(name, args, id_factory()) for name, args in calls]
        text = text[end:]
    content.append(text)
    out.content = "".join(content)
    return out


def collect_deltas(deltas: list[dict], thinking_mode: str,
                   error: str | None = None) -> ParsedCompletion:
    """Add up streamed deltas (as a client would) into one ParsedCompletion."""
    out = ParsedCompletion(reasoning_content="" if thinking_mode == "thinking" else None,
                           error=error)
    for delta in deltas:
        if "reasoning_content" in delta:
            out.reasoning_content += delta["reasoning_content"]
        if "content" in delta:
            out.content += delta["content"]
        for call in delta.get("tool_calls", ()):
            assert call["index"] == len(out.tool_calls), "tool call deltas out of order"
            fn = call["function"]
            out.tool_calls.append(tool_call(fn["name"], fn["arguments"], call["id"]))
    return out
