"""v4serve: an inference engine for the DeepSeek-V4 family."""

from v4serve.engine import LLM, CompletionOutput, RequestOutput, SamplingParams, StructuredOutputsParams

__version__ = "0.1.0"
__all__ = ["LLM", "CompletionOutput", "RequestOutput", "SamplingParams", "StructuredOutputsParams"]
