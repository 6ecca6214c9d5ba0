"""v4serve: an inference engine for the DeepSeek-V4 family."""

__version__ = "0.1.0"
