"""LLMs for kglightning: backends (local transformers incl. GGUF, OpenAI-compatible HTTP), prompts and parsing."""

from kglightning.llm.backends import (
    BUNDLED_SMOLLM2,
    ChatMessage,
    Generation,
    GenerationParams,
    LLMBackend,
    LLMBackendError,
    LLMHTTPError,
    LLMTimeoutError,
    LocalHFBackend,
    OpenAIChatBackend,
    ResponseCache,
    bundled_smollm2_path,
)

__all__ = [
    "BUNDLED_SMOLLM2",
    "ChatCompletionServer",
    "ChatMessage",
    "Generation",
    "GenerationParams",
    "LLMBackend",
    "LLMBackendError",
    "LLMHTTPError",
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
