"""OpenAI `tools`: each a function with a unique name and a JSON Schema for its arguments.

    {"type": "function", "function": {"name": "get_weather", "description": "...",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}

`parameters` (optional) must be a JSON Schema object schema, as OpenAI requires: `type` is
"object", `properties` maps names to schemas (objects), `required` lists names that are in
`properties`. Nested schemas (`properties`, `items`, `anyOf` / `oneOf` / `allOf`,
`additionalProperties`) get the same shape checks; their `type` is a string or a list of strings.
Names follow OpenAI's rule (letters, digits, `_`, `-`; we also allow `.`), at most 64 characters,
and two tools of one request may not share a name: the model calls tools by name.
"""

from __future__ import annotations

import re
from typing import Any

from v4serve.server.errors import bad_field

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_COMBINERS = ("anyOf", "oneOf", "allOf")


def check_tools(tools: Any, where: str) -> None:
    """Raise a 400 naming the first bad field of a `tools` list (`tools[1].function.parameters.type`)."""
    if not isinstance(tools, list):
        raise bad_field(where, "expected a list of tools")
    seen: dict[str, int] = {}
    for k, tool in enumerate(tools):
        at = f"{where}[{k}]"
        if not isinstance(tool, dict):
            raise bad_field(at, "expected an object")
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise bad_field(f"{at}.function", "expected an object")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise bad_field(f"{at}.function.name", "expected 1-64 letters, digits, '_', '-' or '.'")
        if name in seen:
            raise bad_field(f"{at}.function.name", f"duplicate tool name {name!r} (also {where}[{seen[name]}])")
        seen[name] = k
        description = fn.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_field(f"{at}.function.description", "expected a string")
        if fn.get("parameters") is not None:
            check_object_schema(fn["parameters"], f"{at}.function.parameters")


def check_object_schema(schema: Any, where: str) -> None:
    """The top-level `parameters` schema: an object schema (an empty `{}` means no arguments)."""
    if not isinstance(schema, dict):
        raise bad_field(where, "expected a JSON Schema object, e.g. {\"type\": \"object\", \"properties\": {...}}")
    if schema and schema.get("type") != "object":
        raise bad_field(f"{where}.type", f"expected \"object\", got {_show(schema.get('type'))}")
    check_schema(schema, where)


def check_schema(schema: Any, where: str) -> None:
    """Shape checks of one (sub)schema; iterative over nested schemas."""
    stack = [(schema, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, bool):  # JSON Schema allows true / false as schemas
            continue
        if not isinstance(node, dict):
            raise bad_field(at, "expected a JSON Schema (an object)")
        kind = node.get("type")
        if kind is not None and not (isinstance(kind, str) or (
                isinstance(kind, list) and kind and all(isinstance(t, str) for t in kind))):
            raise bad_field(f"{at}.type", f"expected a type name or a list of them, got {_show(kind)}")
        properties = node.get("properties")
        if properties is not None:
            if not isinstance(properties, dict):
                raise bad_field(f"{at}.properties", f"expected an object of property schemas, got {_show(properties)}")
            for name, sub in properties.items():
                if not isinstance(sub, (dict, bool)):
                    raise bad_field(f"{at}.properties.{name}", f"expected a JSON Schema (an object), got {_show(sub)}")
                stack.append((sub, f"{at}.properties.{name}"))
        required = node.get("required")
        if required is not None:
            if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
                raise bad_field(f"{at}.required", f"expected a list of property names, got {_show(required)}")
            missing = [r for r in required if properties is not None and r not in properties]
            if missing:
                raise bad_field(f"{at}.required", f"names {missing[:5]} not in properties")
        for key in ("items", "additionalProperties"):
            sub = node.get(key)
            if isinstance(sub, list) and key == "items":  # tuple validation (older drafts)
                stack.extend((s, f"{at}.items[{i}]") for i, s in enumerate(sub))
            elif sub is not None:
                stack.append((sub, f"{at}.{key}"))
        for key in _COMBINERS:
            if key in node:
                options = node[key]
                if not isinstance(options, list) or not options:
                    raise bad_field(f"{at}.{key}", "expected a non-empty list of schemas")
                stack.extend((sub, f"{at}.{key}[{i}]") for i, sub in enumerate(options))


def _show(value: Any) -> str:
    text = repr(value)
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value))
    return f"{kind} {text[:40]}" if kind and value is not None else text[:40]
