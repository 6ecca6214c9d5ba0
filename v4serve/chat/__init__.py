"""DeepSeek-V4 chat format: messages to prompt text, completion text back to OpenAI fields.

DeepSeek-V4 ships no Jinja template; its prompt is plain text with special tokens:

    <｜begin▁of▁sentence｜>   BOS, once at the start; the system content follows it directly
    <｜User｜>                a user turn (developer messages and tool results are user turns)
    <｜Assistant｜>           an assistant turn, closed by <｜end▁of▁sentence｜> (EOS)
    <｜latest_reminder｜>     a reminder (date, place, locale) at its place in the conversation
    <think> ... </think>     reasoning; `</think>` right after <｜Assistant｜> means no reasoning
    <｜DSML｜tool_calls>      a tool-call block in DSML markup (see `dsml`)
    <｜action｜> <｜query｜> <｜authority｜> <｜domain｜> <｜read_url｜> <｜title｜>
                             quick-instruction tasks: short auxiliary outputs

    encode_messages(messages, thinking_mode, ...) -> prompt text (see `encoding`)
    parse_completion(text, thinking_mode) -> ParsedCompletion (see `parsing`)
    StreamingParser(thinking_mode).feed(piece) -> OpenAI deltas (see `streaming`)

This package sits between the engine and the server and imports neither.
"""

from v4serve.chat.encoding import encode_messages
from v4serve.chat.parsing import ParsedCompletion, collect_deltas, parse_completion, random_call_id
from v4serve.chat.streaming import StreamingParser

__all__ = [
    "ParsedCompletion",
    "StreamingParser",
    "collect_deltas",
    "encode_messages",
    "parse_completion",
    "random_call_id",
]
