"""A request's state as the `RequestOutput` the API returns (a snapshot: lists are copied)."""

from __future__ import annotations

from v4serve.engine.outputs import CompletionOutput, RequestOutput
from v4serve.engine.request import Request


def request_output(request: Request) -> RequestOutput:
    completion = CompletionOutput(
        index=0,
        text=request.text,
        token_ids=list(request.output_token_ids),
        cumulative_logprob=request.cumulative_logprob,
        logprobs=list(request.output_logprobs) if request.params.logprobs is not None else None,
        finish_reason=request.finish_reason,
        stop_reason=request.stop_reason,
    )
    return RequestOutput(
        request_id=request.request_id,
        prompt=request.prompt,
        prompt_token_ids=list(request.prompt_token_ids),
        prompt_logprobs=list(request.prompt_logprobs) if request.params.prompt_logprobs is not None else None,
        outputs=[completion],
        finished=request.finish_reason is not None,
    )
