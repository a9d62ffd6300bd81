"""demo-engine: a small OpenAI-compatible inference server standing in for an SGLang/vLLM fork."""

__version__ = "0.5.12"
