"""Incremental completion parsing: OpenAI streaming deltas while the text arrives."""

from typing import Callable

from v4serve.chat.dsml import parse_tool_block
from v4serve.chat.messages import check_thinking_mode
from v4serve.chat.parsing import random_call_id
from v4serve.chat.tokens import (
    THINK_END, TOOL_CALLS_END, TOOL_CALLS_SEPARATOR, TOOL_CALLS_START,
)


class StreamingParser:
    """Feed completion text piece by piece; get deltas that add up to `parse_completion`.

    Each delta is a dict with one key: `reasoning_content` or `content` (a string), or
    `tool_calls` (a list of one `{"index", "id", "type", "function": {"name", "arguments"}}`).
    Text that could be the start of `</think>` or of a tool-call block is held back until the
    next piece shows what it is, so no partial marker is ever emitted. A tool-call block is held
    until it closes, then checked as a whole: its calls come out together (complete
    arguments), or, if it does not parse, its raw text comes out as content.

        parser = StreamingParser("thinking", tool_names={"search"})
        for piece in pieces:
            send(parser.feed(piece))
        deltas, error = parser.finish()
    """

    def __init__(self, thinking_mode: str, tool_names=None,
                 id_factory: Callable[[], str] = random_call_id):
        check_thinking_mode(thinking_mode)
        self.tool_names = tool_names
        self.id_factory = id_factory
        self.error: str | None = None
        self._state = "reasoning_content" if thinking_mode == "thinking" else "content"
        self._pending = ""  # text received but not emitted yet
        self._separator = ""  # the blank line held before an open tool-call block
        self._num_calls = 0
        self._finished = False

    def feed(self, text: str) -> list[dict]:
        assert not self._finished, "feed() after finish()"
        self._pending += text
        deltas: list[dict] = []
        while self._step(deltas):
            pass
        return deltas

    def finish(self) -> tuple[list[dict], str | None]:
        """Flush what is held back; returns the last deltas and the error (None if clean)."""
        assert not self._finished, "finish() called twice"
        self._finished = True
        deltas: list[dict] = []
        if self._state == "tool_calls":
            self.error = self.error or "tool_calls block is not closed"
            self._emit(deltas, "content", self._separator + self._pending)
        else:
            self._emit(deltas, self._state, self._pending)
        self._pending = ""
        return deltas, self.error

    def _step(self, deltas: list[dict]) -> bool:
        """Consume what can be decided now; True if the state changed and another step may."""
        text = self._pending
        if self._state == "reasoning_content":
            end = text.find(THINK_END)
            if end < 0:
                return self._emit_safe(deltas, "reasoning_content", (THINK_END,))
            self._emit(deltas, "reasoning_content", text[:end])
            self._pending, self._state = text[end + len(THINK_END):], "content"
            return True
        if self._state == "content":
            start = text.find(TOOL_CALLS_START)
            if start < 0:
                markers = (TOOL_CALLS_SEPARATOR + TOOL_CALLS_START, TOOL_CALLS_START)
                return self._emit_safe(deltas, "content", markers)
            before = text[:start]
            has_separator = before.endswith(TOOL_CALLS_SEPARATOR)
            self._separator = TOOL_CALLS_SEPARATOR if has_separator else ""
            self._emit(deltas, "content", before[:len(before) - len(self._separator)])
            self._pending, self._state = text[start:], "tool_calls"
            return True
        end = text.find(TOOL_CALLS_END)
        if end < 0:
            return False
        end += len(TOOL_CALLS_END)
        self._close_block(deltas, text[:end])
        self._pending, self._state = text[end:], "content"
        return True

    def _close_block(self, deltas: list[dict], block: str) -> None:
        calls, error = parse_tool_block(block, self.tool_names)
        if error:
            self.error = self.error or error
            self._emit(deltas, "content", self._separator + block)
        for name, arguments in calls:
            function = {"name": name, "arguments": arguments}
            call = {"index": self._num_calls, "id": self.id_factory(), "type": "function",
                    "function": function}
            deltas.append({"tool_calls": [call]})
            self._num_calls += 1

    def _emit_safe(self, deltas: list[dict], key: str, markers: tuple[str, ...]) -> bool:
        """Emit the pending text except a tail that may begin one of the markers."""
        held = max(_prefix_overlap(self._pending, m) for m in markers)
        cut = len(self._pending) - held
        self._emit(deltas, key, self._pending[:cut])
        self._pending = self._pending[cut:]
        return False

    def _emit(self, deltas: list[dict], key: str, text: str) -> None:
        if text:
            deltas.append({key: text})


def _prefix_overlap(text: str, marker: str) -> int:
    """Length of the longest end of `text` that is a proper start of `marker`."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
