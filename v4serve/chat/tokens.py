"""Special tokens and fixed prompt texts of the DeepSeek-V4 chat format.

The full-width bar `｜` (U+FF5C) and the block `▁` (U+2581) are part of the token strings; the
tokenizer maps each of these strings to one special token id.
"""

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
LATEST_REMINDER = "<｜latest_reminder｜>"
THINK_START = "<think>"
THINK_END = "</think>"
DSML = "｜DSML｜"

TOOL_CALLS_START = f"<{DSML}tool_calls>"
TOOL_CALLS_END = f"</{DSML}tool_calls>"
TOOL_CALLS_SEPARATOR = "\n\n"  # between an assistant's content and its tool-call block
INVOKE_END = f"</{DSML}invoke>"
PARAMETER_END = f"</{DSML}parameter>"

# Quick-instruction tasks: a `task` field on a message asks for a short auxiliary output.
TASK_TOKENS = {
    "action": "<｜action｜>",
    "query": "<｜query｜>",
    "authority": "<｜authority｜>",
    "domain": "<｜domain｜>",
    "read_url": "<｜read_url｜>",
    "title": "<｜title｜>",
}

# Only "max" changes the prompt; "high" is the trained default and adds nothing.
REASONING_EFFORT_PREFIX = {
    None: "",
    "high": "",
    "max": (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
        "resolve the root cause, rigorously stress-testing your logic against all potential "
        "paths, edge cases, and adversarial scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate "
        "step, considered alternative, and rejected hypothesis to ensure absolutely no "
        "assumption is left unchecked.\n\n"
    ),
}
