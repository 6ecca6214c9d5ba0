"""An EBNF grammar (xgrammar's dialect) for a well-formed DSML tool-call block (chat/dsml.py),
for `tool_choice: "required"` (one or more calls of the offered tools) and a named function
(exactly one call of it).

    root   ::= "<｜DSML｜tool_calls>\\n" invoke ("\\n" invoke)* "\\n</｜DSML｜tool_calls>"
    invoke ::= "<｜DSML｜invoke name=\\"NAME\\">\\n" param* "</｜DSML｜invoke>"
    param  ::= "<｜DSML｜parameter name=\\"KEY\\" string=\\"true\\">" [^<]* "</｜DSML｜parameter>\\n"
             | "<｜DSML｜parameter name=\\"KEY\\" string=\\"false\\">" json_value "</｜DSML｜parameter>\\n"

Parameters come in the order of the tool's `parameters.properties`, the `required` ones always,
the others optionally; a property whose schema type is "string" is written raw (string="true"),
one of its `enum` values or of its minLength / maxLength when the schema gives them; any other as a
JSON value (string="false") of its `enum` (an integer's minimum..maximum when that is a short
list), or of its type (integer, number, boolean, null, object, array), or any JSON value where the
schema says neither. Raw strings cannot contain "<" (the
block's parser ends a value at the next DSML tag).
"""

from __future__ import annotations

import json

from v4serve.chat.tokens import DSML, INVOKE_END, PARAMETER_END, TOOL_CALLS_END, TOOL_CALLS_START
from v4serve.engine.structured_output import ebnf_literal

_JSON_VALUE = r'''
json_value ::= json_object | json_array | json_string | json_number | "true" | "false" | "null"
json_object ::= "{" (json_string ":" json_value ("," json_string ":" json_value)*)? "}"
json_array ::= "[" (json_value ("," json_value)*)? "]"
json_string ::= "\"" json_char* "\""
json_char ::= [^"\\\x00-\x1f] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])
json_number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
json_integer ::= "-"? ("0" | [1-9] [0-9]*)
raw_text ::= [^<]*
'''


_JSON_TYPES = {"integer": "json_integer", "number": "json_number", "boolean": '("true" | "false")',
               "null": '"null"', "object": "json_object", "array": "json_array"}


def _enum(spec: dict, render) -> str | None:
    """The alternatives of the schema's `enum` values, each written by `render`; None without one."""
    values = spec.get("enum")
    if not isinstance(values, list) or not values:
        return None
    return "(" + " | ".join(ebnf_literal(render(v)) for v in values) + ")"


SMALL_RANGE = 256  # an integer with minimum and maximum at most this many values apart is their list


def _json_value(spec) -> str:
    """A JSON-written parameter's rule: its enum, else a small integer range as its values, else its
    type's values, else any JSON value."""
    if not isinstance(spec, dict):
        return "json_value"
    lo, hi = spec.get("minimum"), spec.get("maximum")
    if (spec.get("type") == "integer" and "enum" not in spec and isinstance(lo, int) and isinstance(hi, int)
            and 0 <= hi - lo < SMALL_RANGE):
        spec = {"enum": list(range(lo, hi + 1))}
    return _enum(spec, lambda v: json.dumps(v, ensure_ascii=False)) or _JSON_TYPES.get(spec.get("type"), "json_value")


def _raw_text(spec: dict) -> str:
    """A raw string value: one of the schema's enum strings, or of its minLength / maxLength (in
    characters) when given."""
    enum = _enum(spec, str)
    if enum is not None:
        return enum
    lo, hi = spec.get("minLength"), spec.get("maxLength")
    if not isinstance(lo, int) and not isinstance(hi, int):
        return "raw_text"
    lo = lo if isinstance(lo, int) and lo >= 0 else 0
    return f"[^<]{{{lo},{hi}}}" if isinstance(hi, int) and hi >= lo else f"[^<]{{{lo},}}"


def _invoke_rule(index: int, function: dict) -> list[str]:
    name = function["name"]
    schema = function.get("parameters") or {}
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    parts = []
    for key, spec in properties.items():
        raw = isinstance(spec, dict) and spec.get("type") == "string"
        head = f'<{DSML}parameter name="{key}" string="{"true" if raw else "false"}">'
        value = _raw_text(spec) if raw else _json_value(spec)
        item = f"{ebnf_literal(head)} {value} {ebnf_literal(PARAMETER_END + chr(10))}"
        parts.append(f"({item})" if key in required else f"({item})?")
    head = ebnf_literal(f'<{DSML}invoke name="{name}">\n')
    return [f"invoke{index} ::= {head} {' '.join(parts)} {ebnf_literal(INVOKE_END)}".replace("  ", " ")]


def tool_call_grammar(tools: list[dict], name: str | None = None) -> str:
    """The grammar of one block calling `name` once, or (name None) any of `tools` one or more times."""
    functions = [t["function"] for t in tools]
    if name is not None:
        functions = [f for f in functions if f["name"] == name]
    rules = []
    for i, function in enumerate(functions):
        rules += _invoke_rule(i, function)
    invoke = " | ".join(f"invoke{i}" for i in range(len(functions)))
    more = "" if name is not None else f' ({ebnf_literal(chr(10))} invoke)*'
    root = (f"root ::= {ebnf_literal(TOOL_CALLS_START + chr(10))} invoke{more} "
            f"{ebnf_literal(chr(10) + TOOL_CALLS_END)}")
    return "\n".join([root, f"invoke ::= {invoke}", *rules]) + _JSON_VALUE
