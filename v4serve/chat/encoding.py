"""Messages to DeepSeek-V4 prompt text.

    BOS [effort prefix] system [## Tools]            (system content follows BOS directly)
    <｜latest_reminder｜>{content}
    <｜User｜>{content}                                (user; developer adds its ## Tools block)
    <｜User｜><tool_result>...</tool_result>          (tool results, merged into one user turn)
    <｜Assistant｜><think>{reasoning}</think>{content}[\\n\\n{DSML block}]<｜end▁of▁sentence｜>

The `<think>` or `</think>` after `<｜Assistant｜>` belongs to the prompt: it is written after a
user or developer turn that is followed by an assistant turn (or by nothing: the generation
prompt). `<think>` opens reasoning (thinking mode); `</think>` alone means answer directly (chat
mode, and in thinking mode the turns whose reasoning is dropped).
"""

from v4serve.chat.dsml import render_tool_calls, render_tools
from v4serve.chat.messages import (
    Turn, check_messages, check_thinking_mode, check_tools, merge_tool_results,
)
from v4serve.chat.tokens import (
    ASSISTANT, BOS, EOS, LATEST_REMINDER, REASONING_EFFORT_PREFIX, TASK_TOKENS, THINK_END,
    THINK_START, TOOL_CALLS_SEPARATOR, USER,
)


def encode_messages(messages: list[dict], thinking_mode: str = "chat", drop_thinking: bool = True,
                    reasoning_effort: str | None = None, tools: list[dict] | None = None) -> str:
    """Encode OpenAI-shaped chat messages as DeepSeek-V4 prompt text, BOS included.

    messages: dicts with role system | user | assistant | tool | latest_reminder | developer.
        Assistant messages may carry `reasoning_content` and OpenAI `tool_calls`; system and
        developer messages may carry OpenAI `tools`; any message may carry a quick-instruction
        `task` (action, query, authority, domain, read_url, title).
    thinking_mode: "chat" (answer directly) or "thinking" (reason inside <think>...</think>).
    drop_thinking: in thinking mode, drop the reasoning of assistant turns before the last user
        message (and developer messages before it). Ignored when any tools are present: tool
        use keeps every turn's reasoning.
    reasoning_effort: None or "high" (the default, no prompt change) or "max" (thinking mode
        only: a fixed instruction opens the prompt).
    tools: OpenAI `tools`, the API-style alternative to `tools` on a message. They are attached
        to the first system message; a system message with empty content is put first if there
        is none. Giving tools both ways is an error.

    A prompt whose last message is user or developer ends with the generation prompt
    `<｜Assistant｜><think>` (thinking) or `<｜Assistant｜></think>` (chat).
    Raises ValueError naming the offending field (`messages[3].tool_calls[0].function.name`).
    """
    check_thinking_mode(thinking_mode)
    if reasoning_effort not in REASONING_EFFORT_PREFIX:
        raise ValueError(f"reasoning_effort: {reasoning_effort!r} is not None, 'high' or 'max'")
    turns = check_messages(messages)
    if tools:
        _attach_tools(turns, check_tools(tools, "tools"))
    turns = merge_tool_results(turns)
    thinking = thinking_mode == "thinking"
    drop = thinking and drop_thinking and not any(t.tools for t in turns)
    if drop:
        last_user = _last_user_index(turns)
        turns = [t for n, t in enumerate(turns) if t.role != "developer" or n >= last_user]
    last_user = _last_user_index(turns) if drop else -1

    parts = [BOS, REASONING_EFFORT_PREFIX[reasoning_effort] if thinking else ""]
    for n, turn in enumerate(turns):
        # NOTE: drop => only turns after the last user message keep or open reasoning.
        prev_task = n > 0 and turns[n - 1].task is not None
        keep_reasoning = thinking and not prev_task and n > last_user
        parts.append(_render_turn(turn, keep_reasoning))
        if n + 1 == len(turns) or turns[n + 1].role in ("assistant", "latest_reminder"):
            parts.append(_transition(turn, thinking, open_thinking=thinking and n >= last_user))
    return "".join(parts)


def _attach_tools(turns: list[Turn], functions: list[dict]) -> None:
    for n, turn in enumerate(turns):
        if turn.tools:
            raise ValueError(f"tools: also given on messages[{n}].tools; give them one way")
    system = next((t for t in turns if t.role == "system"), None)
    if system is None:
        system = Turn("system")
        turns.insert(0, system)
    system.tools = functions


def _last_user_index(turns: list[Turn]) -> int:
    return max((n for n, t in enumerate(turns) if t.role in ("user", "developer")), default=-1)


def _render_turn(turn: Turn, keep_reasoning: bool) -> str:
    tools = "\n\n" + render_tools(turn.tools) if turn.tools else ""
    if turn.role == "system":
        return turn.content + tools
    if turn.role == "developer":
        return USER + turn.content + tools
    if turn.role == "user":
        return USER + turn.content
    if turn.role == "latest_reminder":
        return LATEST_REMINDER + turn.content
    assert turn.role == "assistant", turn.role
    reasoning = (turn.reasoning_content or "") + THINK_END if keep_reasoning else ""
    calls = [(name, args) for name, args, _ in turn.tool_calls]
    calls_text = TOOL_CALLS_SEPARATOR + render_tool_calls(calls) if calls else ""
    return reasoning + turn.content + calls_text + EOS


def _transition(turn: Turn, thinking: bool, open_thinking: bool) -> str:
    """What follows a turn that precedes an assistant turn, a reminder, or the end."""
    if turn.task == "action":
        return ASSISTANT + (THINK_START if thinking else THINK_END) + TASK_TOKENS["action"]
    if turn.task is not None:
        return TASK_TOKENS[turn.task]
    if turn.role in ("user", "developer"):
        return ASSISTANT + (THINK_START if open_thinking else THINK_END)
    return ""
