"""LLMs for kglightning: backends (local transformers incl. GGUF, OpenAI-compatible HTTP), prompts and parsing.

The package re-exports :mod:`kglightning.llm.backends` (``__all__`` is the same list); prompts, parsing,
grounding and the KG-Trie live in their own modules (``kglightning.llm.prompts``, ``.parsing``, ``.grounding``,
``.trie``).
"""

from kglightning.llm import backends as _backends

__all__ = list(_backends.__all__)


def __getattr__(name: str) -> object:
    # delegate, so that the backends package's lazy names (ChatCompletionServer) stay lazy
    if name in __all__:
        return getattr(_backends, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
