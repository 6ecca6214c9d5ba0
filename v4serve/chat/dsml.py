"""DSML, the markup DeepSeek-V4 uses for tool calls, and the `## Tools` prompt block.

A tool-call block, as the model writes it after its reasoning and content:

    <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="location" string="true">Beijing</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

`string="true"` values are raw text; `string="false"` values are JSON (numbers, booleans, arrays,
objects, null). Each invoke becomes one OpenAI tool call whose `arguments` is the JSON object of
its parameters.
"""

import json
import re

from v4serve.chat.tokens import (
    DSML, INVOKE_END, PARAMETER_END, THINK_END, THINK_START, TOOL_CALLS_END, TOOL_CALLS_START,
)

_TOOLS_HEADER = f"""## Tools

You have access to a set of tools to help answer the user's question. \
You can invoke tools by writing a "{TOOL_CALLS_START}" block like the following:

{TOOL_CALLS_START}
<{DSML}invoke name="$TOOL_NAME">
<{DSML}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE{PARAMETER_END}
...
{INVOKE_END}
<{DSML}invoke name="$TOOL_NAME2">
...
{INVOKE_END}
{TOOL_CALLS_END}

String parameters should be specified as is and set `string="true"`. \
For all other types (numbers, booleans, arrays, objects), \
pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {THINK_START}), \
you MUST output your complete reasoning inside {THINK_START}...{THINK_END} \
BEFORE any tool calls or final response.

Otherwise, output directly after {THINK_END} with tool calls or final response.

### Available Tool Schemas

"""

_TOOLS_FOOTER = """

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""

_INVOKE_OPEN = re.compile(f'<{DSML}invoke name="([^"]*)">')
_PARAMETER_OPEN = re.compile(f'<{DSML}parameter name="([^"]*)" string="(true|false)">')


def to_json(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def render_tools(functions: list[dict]) -> str:
    """The `## Tools` block for OpenAI `function` objects (name, description, parameters)."""
    return _TOOLS_HEADER + "\n".join(to_json(f) for f in functions) + _TOOLS_FOOTER


def render_tool_calls(calls: list[tuple[str, dict]]) -> str:
    """A DSML block for (name, arguments) pairs, arguments already decoded from JSON."""
    invokes = []
    for name, arguments in calls:
        lines = [f'<{DSML}invoke name="{name}">']
        for key, value in arguments.items():
            is_str = isinstance(value, str)
            text = value if is_str else to_json(value)
            flag = "true" if is_str else "false"
            lines.append(f'<{DSML}parameter name="{key}" string="{flag}">{text}{PARAMETER_END}')
        lines.append(INVOKE_END)
        invokes.append("\n".join(lines))
    return "\n".join([TOOL_CALLS_START, *invokes, TOOL_CALLS_END])


def parse_tool_block(block: str, tool_names=None) -> tuple[list[tuple[str, str]], str | None]:
    """Parse one complete block, opening and closing tags included.

    Returns ([(name, arguments_json), ...], None) or ([], reason). Whitespace between tags is
    ignored; parameter values are taken exactly as written.
    """
    assert block.startswith(TOOL_CALLS_START) and block.endswith(TOOL_CALLS_END)
    body, pos = block[:-len(TOOL_CALLS_END)], len(TOOL_CALLS_START)
    calls = []
    while True:
        pos = _skip_space(body, pos)
        if pos == len(body):
            break
        match = _INVOKE_OPEN.match(body, pos)
        if match is None:
            return [], f"expected <{DSML}invoke name=...> at offset {pos} of the tool_calls block"
        name = match.group(1)
        if tool_names is not None and name not in tool_names:
            return [], f"unknown tool {name!r}"
        arguments, pos, error = _parse_parameters(body, match.end(), name)
        if error:
            return [], error
        calls.append((name, to_json(arguments)))
    if not calls:
        return [], "tool_calls block has no invoke"
    return calls, None


def _parse_parameters(body: str, pos: int, tool: str) -> tuple[dict, int, str | None]:
    arguments = {}
    while True:
        pos = _skip_space(body, pos)
        if body.startswith(INVOKE_END, pos):
            return arguments, pos + len(INVOKE_END), None
        match = _PARAMETER_OPEN.match(body, pos)
        if match is None:
            return {}, pos, f"tool {tool!r}: expected a parameter or {INVOKE_END} at offset {pos}"
        key, flag = match.groups()
        end = body.find(PARAMETER_END, match.end())
        if end < 0 or f"<{DSML}" in body[match.end():end]:  # no close before the next tag
            return {}, pos, f"tool {tool!r}: parameter {key!r} is not closed"
        if key in arguments:
            return {}, pos, f"tool {tool!r}: parameter {key!r} given twice"
        text = body[match.end():end]
        if flag == "true":
            arguments[key] = text
        else:
            try:
                arguments[key] = json.loads(text)
            except ValueError:
                reason = f'parameter {key!r} has string="false" but is not JSON'
                return {}, pos, f"tool {tool!r}: {reason}"
        pos = end + len(PARAMETER_END)


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
