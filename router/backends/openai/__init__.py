"""The `openai` backend: a tier served by any OpenAI-compatible server (vLLM, llama.cpp, hosted)."""

from router.backends.openai.backend import OpenAIBackend

__all__ = ["OpenAIBackend"]
