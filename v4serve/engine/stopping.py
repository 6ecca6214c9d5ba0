"""When a request stops, and the text it ends with (vLLM's rules).

After each new token: end-of-sequence (unless `ignore_eos`) or a stop token id ends it with
"stop", as does a stop string, which is cut from the text; all three wait for `min_tokens`.
Reaching `max_tokens` or the model's maximum length ends it with "length".
"""

from __future__ import annotations

from v4serve.engine.request import Request


def update_after_token(request: Request, token: int, eos_token_ids: tuple[int, ...], max_model_len: int) -> None:
    """Extend the request's text with `token` and set `finish_reason` / `stop_reason` if it stops."""
    params = request.params
    n_out = len(request.output_token_ids)
    new_text = request.detokenizer.append(token)
    if n_out >= params.min_tokens:
        if not params.ignore_eos and token in eos_token_ids:
            request.finish_reason, request.stop_reason = "stop", None
        elif token in params.stop_token_ids:
            request.finish_reason, request.stop_reason = "stop", token
        else:
            _check_stop_strings(request, len(new_text))
    if request.finish_reason is None and (
        (params.max_tokens is not None and n_out >= params.max_tokens) or request.num_tokens >= max_model_len
    ):
        request.finish_reason = "length"
    if request.stop_reason in params.stop:
        return  # the text was cut at the stop string
    if request.finish_reason is not None:
        request.detokenizer.flush()
    request.text = request.detokenizer.text


def _check_stop_strings(request: Request, new_chars: int) -> None:
    """A stop string ends the text (excluded from it); only the new text can complete one."""
    text = request.detokenizer.text
    for stop in request.params.stop:
        at = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))
        if at >= 0:
            request.text = text[:at]
            request.finish_reason, request.stop_reason = "stop", stop
            return
