"""Engine: the offline `LLM` API, the scheduler, the sampler."""

from v4serve.engine.engine import Engine, EngineArgs
from v4serve.engine.llm import LLM
from v4serve.engine.outputs import CompletionOutput, Logprob, RequestOutput
from v4serve.engine.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "CompletionOutput", "Engine", "EngineArgs", "Logprob", "RequestOutput", "SamplingParams",
           "StructuredOutputsParams"]
