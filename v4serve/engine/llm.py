"""`LLM`: the offline API (vLLM's conventions)."""

from __future__ import annotations

import warnings
from typing import Any, Sequence

from tqdm import tqdm

from v4serve.engine.engine import Engine, EngineArgs
from v4serve.engine.outputs import RequestOutput
from v4serve.engine.sampling_params import SamplingParams


class LLM:
    """Generate with a DeepSeek-V4 model: `LLM("tiny").generate(["Hello"], SamplingParams(max_tokens=8))`.

    `model` is a preset name (`tiny`, `deepseek-v4-flash`, `deepseek-v4-pro`, `deepseek-v4.1-flash`) or a
    checkpoint folder.
    Keyword arguments are those of `EngineArgs` (device, dtype, kv_cache_dtype, max_model_len, ...);
    `kv_format` is the deprecated name of `kv_cache_dtype`."""

    def __init__(self, model: str, **kwargs: Any):
        if "kv_format" in kwargs:
            warnings.warn("LLM(kv_format=...) is deprecated; use kv_cache_dtype (\"auto\" or \"bf16\")",
                          DeprecationWarning, stacklevel=2)
            kwargs["kv_cache_dtype"] = kwargs.pop("kv_format")
        self.engine = Engine(EngineArgs(model=model, **kwargs))
        self.tokenizer = self.engine.tokenizer
        self._next_id = 0

    def generate(
        self,
        prompts: str | Sequence[str] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        prompt_token_ids: Sequence[Sequence[int]] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Complete every prompt; outputs come back in the order of the prompts.

        Give text `prompts` (encoded as written, special tokens recognised, no BOS added) or
        `prompt_token_ids`. One `SamplingParams` for all, or one per prompt."""
        if (prompts is None) == (prompt_token_ids is None):
            raise ValueError("give exactly one of `prompts` and `prompt_token_ids`")
        if isinstance(prompts, str):
            prompts = [prompts]
        texts = list(prompts) if prompts is not None else [None] * len(prompt_token_ids)
        if prompts is not None:
            for i, p in enumerate(texts):
                if not isinstance(p, str) or not p:
                    raise ValueError(f"prompts[{i}] is empty or not a string")
            ids = [self.tokenizer.encode(p) for p in texts]
        else:
            ids = [list(p) for p in prompt_token_ids]
        params = sampling_params if sampling_params is not None else SamplingParams()
        params = [params] * len(ids) if isinstance(params, SamplingParams) else list(params)
        if len(params) != len(ids):
            raise ValueError(f"{len(params)} sampling params for {len(ids)} prompts")
        for p in ids:
            self.engine.validate_prompt(p)

        # n > 1 runs as n requests; their completions are gathered under one RequestOutput.
        groups: list[list[str]] = []
        for text, prompt, sp in zip(texts, ids, params):
            group = []
            for i in range(sp.n):
                rid = f"{self._next_id}"
                self._next_id += 1
                seeded = sp if sp.seed is None or i == 0 else _with_seed(sp, sp.seed + i)
                self.engine.add_request(rid, prompt, seeded, text)
                group.append(rid)
            groups.append(group)
        finished: dict[str, RequestOutput] = {}
        total = sum(len(g) for g in groups)
        with tqdm(total=total, desc="Generating", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished():
                for out in self.engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        bar.update(1)
        results = []
        for group in groups:
            first = finished[group[0]]
            for index, rid in enumerate(group[1:], start=1):
                completion = finished[rid].outputs[0]
                completion.index = index
                first.outputs.append(completion)
            results.append(first)
        return results


    def chat(
        self,
        messages: list[dict] | Sequence[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        tools: list[dict] | None = None,
        thinking: bool = False,
        reasoning_effort: str | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of OpenAI-shaped messages) or several.

        The prompt is `v4serve.chat.encode_messages` in chat mode, or thinking mode when
        `thinking`; parse each output's text with `v4serve.chat.parse_completion(text,
        "thinking" if thinking else "chat")` to get reasoning, content and tool calls."""
        from v4serve.chat import encode_messages

        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        mode = "thinking" if thinking else "chat"
        prompts = [encode_messages(c, mode, reasoning_effort=reasoning_effort, tools=tools) for c in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)


def _with_seed(params: SamplingParams, seed: int) -> SamplingParams:
    from dataclasses import replace

    return replace(params, seed=seed)
