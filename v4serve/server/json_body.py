"""Request bodies as JSON: strict UTF-8, a nesting limit, and text that is valid Unicode.

JSON's `\\uXXXX` escapes can spell a lone UTF-16 surrogate (U+D800..U+DFFF): JavaScript
clients send one when they cut a string inside an emoji (`"pizza \\ud83d"`). Python decodes
it into a `str` that no UTF-8 codec, and so no tokenizer, accepts. Every string of the body,
object keys included, is checked once here, and an error names its field
(`messages[0].content`), so nothing downstream meets such a string.

Nesting: the parser itself refuses beyond the interpreter's recursion limit (RecursionError,
answered as a 400 here); the walk below refuses anything deeper than `MAX_JSON_DEPTH` levels.
The walk is iterative, and builds a path only for containers and on failure.
"""

from __future__ import annotations

import json
from typing import Any

from v4serve.server.errors import APIError

MAX_JSON_DEPTH = 64  # the body object is level 1; OpenAI requests with tool schemas use ~10-20


def parse_json_body(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """A JSON object from raw request bytes; every error is a 400 naming `body` or the field."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(f"body: not valid UTF-8 (byte {e.start})", param="body") from None
    body = _loads(text, "body")
    del text
    if not isinstance(body, dict):
        raise APIError("body: expected a JSON object", param="body")
    check_json_value(body, (), max_depth)
    return body


def parse_json_text(text: str, param: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON document held in a string field (tool-call `arguments`), checked like a body."""
    value = _loads(text, param)
    check_json_value(value, _split(param), max_depth)
    return value


def _loads(text: str, param: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise APIError(f"{param}: nested too deeply (the limit is {MAX_JSON_DEPTH} levels)", param=param) from None
    except json.JSONDecodeError as e:
        raise APIError(f"{param}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})",
                       param=param) from None


def check_json_value(value: Any, path: tuple, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse a lone surrogate in any string or key, and nesting deeper than `max_depth`."""
    stack = [(value, path, len(path) or 1)]
    while stack:
        node, where, depth = stack.pop()
        if depth > max_depth:
            field = format_path(where[:1]) or "body"
            raise APIError(f"{field}: nested deeper than {max_depth} levels (at {format_path(where)[:200]})",
                           param=field)
        if isinstance(node, dict):
            for key, item in node.items():
                _check_text(key, where, key=True)
                if isinstance(item, str):
                    _check_text(item, where + (key,))
                elif isinstance(item, (dict, list)):
                    stack.append((item, where + (key,), depth + 1))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, str):
                    _check_text(item, where + (i,))
                elif isinstance(item, (dict, list)):
                    stack.append((item, where + (i,), depth + 1))
        elif isinstance(node, str):
            _check_text(node, where)


def bad_code_point(text: str) -> int | None:
    """The index of the first code point UTF-8 cannot encode (a lone surrogate), or None."""
    if text.isascii():  # O(1) for CPython's compact strings
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


def _check_text(text: str, where: tuple, key: bool = False) -> None:
    index = bad_code_point(text)
    if index is None:
        return
    field = format_path(where) or "body"
    what = f"the key {text[:index]!r}..." if key else f"character {index}"
    raise APIError(
        f"{field}: invalid code point U+{ord(text[index]):04X} at {what} (a lone UTF-16 surrogate; "
        f"send valid Unicode, e.g. a whole surrogate pair)", param=field, code="invalid_code_point")


def format_path(path: tuple) -> str:
    """("messages", 0, "content") -> "messages[0].content"."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _split(param: str) -> tuple:
    """The inverse of `format_path` for the simple paths this server names."""
    parts: list = []
    for piece in param.replace("[", ".[").split("."):
        if piece.startswith("[") and piece.endswith("]") and piece[1:-1].isdigit():
            parts.append(int(piece[1:-1]))
        elif piece:
            parts.append(piece)
    return tuple(parts)
