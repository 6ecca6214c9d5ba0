"""Check OpenAI-shaped chat messages and turn them into the turns the prompt is made of.

Every error is a ValueError that names the offending field as `messages[i].field`
(or `tools[k].field` for the separate tools argument).
"""

import json
from dataclasses import dataclass, field

from v4serve.chat.tokens import TASK_TOKENS

ROLES = ("system", "user", "assistant", "tool", "latest_reminder", "developer")


@dataclass(slots=True)
class Turn:
    """One rendered unit: a message, or a user turn that merged tool results and user texts."""
    role: str
    content: str = ""
    reasoning_content: str | None = None
    tool_calls: list[tuple[str, dict, str | None]] = field(default_factory=list)  # name, args, id
    tools: list[dict] = field(default_factory=list)  # OpenAI `function` objects
    task: str | None = None
    # user turns: (text, is tool result, tool_call_id)
    blocks: list[tuple[str, bool, str | None]] = field(default_factory=list)


def check_thinking_mode(thinking_mode: str) -> None:
    if thinking_mode not in ("chat", "thinking"):
        raise ValueError(f"thinking_mode: {thinking_mode!r} is not 'chat' or 'thinking'")


def check_messages(messages) -> list[Turn]:
    """Validate every message and convert it to a Turn (one per message, tools not merged)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages: expected a non-empty list of message objects")
    return [_check_message(i, m) for i, m in enumerate(messages)]


def check_tools(tools, where: str) -> list[dict]:
    """OpenAI `tools` ([{"type": "function", "function": {...}}]) to their function objects."""
    if not isinstance(tools, list):
        raise ValueError(f"{where}: expected a list of tools")
    functions = []
    for k, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict):
            raise ValueError(f"{where}[{k}].function: expected an object")
        if tool.get("type", "function") != "function":
            raise ValueError(f"{where}[{k}].type: only 'function' tools are supported")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"{where}[{k}].function.name: expected a non-empty string")
        functions.append(fn)
    return functions


def merge_tool_results(turns: list[Turn]) -> list[Turn]:
    """Fold `tool` turns and consecutive user turns into one user turn.

    Tool results become `<tool_result>...</tool_result>` blocks, reordered like the calls of the
    assistant message before them; user texts keep their place; blocks are joined by a blank
    line. A later user message is not merged into a user turn that carries a task; when one is
    merged into a turn without a task, its task (if any) moves to the merged turn.
    """
    merged: list[Turn] = []
    for turn in turns:
        if turn.role not in ("user", "tool"):
            merged.append(turn)
            continue
        prev = merged[-1] if merged else None
        if prev is None or prev.role != "user" or (turn.role == "user" and prev.task):
            prev = Turn("user")
            merged.append(prev)
        prev.blocks.extend(turn.blocks)
        prev.task = prev.task or turn.task
    call_order: dict[str, int] = {}
    for turn in merged:
        if turn.role == "assistant" and turn.tool_calls:
            call_order = {cid: n for n, (_, _, cid) in enumerate(turn.tool_calls) if cid}
        elif turn.role == "user":
            _order_results(turn.blocks, call_order)
            turn.content = "\n\n".join(text for text, _, _ in turn.blocks)
    return merged


def _order_results(blocks: list[tuple[str, bool, str | None]], call_order: dict[str, int]):
    """Sort the tool-result blocks in place by call order; ids not called go last, in order."""
    slots = [n for n, (_, is_result, _) in enumerate(blocks) if is_result]
    results = sorted((blocks[n] for n in slots),
                     key=lambda b: call_order.get(b[2], len(call_order)))
    for n, block in zip(slots, results):
        blocks[n] = block


def _check_message(i: int, msg) -> Turn:
    if not isinstance(msg, dict):
        raise ValueError(f"messages[{i}]: expected an object")
    role = msg.get("role")
    if role not in ROLES:
        raise ValueError(f"messages[{i}].role: {role!r} is not one of {', '.join(ROLES)}")
    task = msg.get("task")
    if task is not None and task not in TASK_TOKENS:
        raise ValueError(f"messages[{i}].task: {task!r} is not one of {', '.join(TASK_TOKENS)}")
    tools = []
    if msg.get("tools") is not None:
        if role not in ("system", "developer"):
            raise ValueError(f"messages[{i}].tools: only system and developer messages take tools")
        tools = check_tools(msg["tools"], f"messages[{i}].tools")
    turn = Turn(role, task=task, tools=tools)
    if role == "assistant":
        turn.tool_calls = _check_tool_calls(i, msg.get("tool_calls"))
        reasoning = msg.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise ValueError(f"messages[{i}].reasoning_content: expected a string")
        turn.reasoning_content = reasoning
    required = role != "assistant" or not turn.tool_calls
    turn.content = _check_content(i, msg.get("content"), required, nonempty=role == "developer")
    if role == "user":
        turn.blocks = [(turn.content, False, None)]
    elif role == "tool":
        call_id = msg.get("tool_call_id")
        if call_id is not None and not isinstance(call_id, str):
            raise ValueError(f"messages[{i}].tool_call_id: expected a string")
        turn.blocks = [(f"<tool_result>{turn.content}</tool_result>", True, call_id)]
    return turn


def _check_content(i: int, content, required: bool, nonempty: bool) -> str:
    if content is None:
        if required:
            raise ValueError(f"messages[{i}].content: missing")
        return ""
    if isinstance(content, list):  # OpenAI content parts: only text parts are supported
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str):
                raise ValueError(f"messages[{i}].content[{j}]: expected a text part")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise ValueError(f"messages[{i}].content: expected a string")
    if nonempty and not content:
        raise ValueError(f"messages[{i}].content: must not be empty")
    return content


def _check_tool_calls(i: int, tool_calls) -> list[tuple[str, dict, str | None]]:
    if tool_calls is None:
        return []
    if not isinstance(tool_calls, list):
        raise ValueError(f"messages[{i}].tool_calls: expected a list")
    calls = []
    for j, call in enumerate(tool_calls):
        where = f"messages[{i}].tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise ValueError(f"{where}.function: expected an object")
        if call.get("type", "function") != "function":
            raise ValueError(f"{where}.type: expected 'function'")
        call_id = call.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise ValueError(f"{where}.id: expected a string")
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}.function.name: expected a non-empty string")
        calls.append((name, _check_arguments(where, fn.get("arguments")), call_id))
    return calls


def _check_arguments(where: str, arguments) -> dict:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise ValueError(f"{where}.function.arguments: not valid JSON") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{where}.function.arguments: expected a JSON object")
    return arguments
