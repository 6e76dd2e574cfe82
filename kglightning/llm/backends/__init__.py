"""LLM backends behind one interface: chat messages in; text plus optional token log-probabilities out.

- :class:`LocalHFBackend`: a local transformers causal LM (GGUF files included; ``"bundled:smollm2"``).
- :class:`OpenAIChatBackend`: any OpenAI-compatible ``/chat/completions`` server (vLLM...), with retries,
  a concurrency limit and a resumable on-disk :class:`ResponseCache`.
- :class:`ChatCompletionServer`: a small OpenAI-compatible server over any backend (tests, local use).
"""

from kglightning.llm.backends.base import (
    ChatMessage,
    Generation,
    GenerationParams,
    LLMBackend,
    LLMBackendError,
)
from kglightning.llm.backends.cache import ResponseCache
from kglightning.llm.backends.chat_response import LLMResponseError
from kglightning.llm.backends.local_hf import BUNDLED_SMOLLM2, LocalHFBackend, bundled_smollm2_path
from kglightning.llm.backends.openai_http import LLMHTTPError, LLMTimeoutError, OpenAIChatBackend

__all__ = [
    "BUNDLED_SMOLLM2",
    "ChatCompletionServer",
    "ChatMessage",
    "Generation",
    "GenerationParams",
    "LLMBackend",
    "LLMBackendError",
    "LLMHTTPError",
    "LLMResponseError",
    "LLMTimeoutError",
    "LocalHFBackend",
    "OpenAIChatBackend",
    "ResponseCache",
    "bundled_smollm2_path",
]


def __getattr__(name: str) -> object:
    # imported on demand, so that `python -m kglightning.llm.backends.server` does not import the server module twice
    if name == "ChatCompletionServer":
        from kglightning.llm.backends.server import ChatCompletionServer

        return ChatCompletionServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
