"""Settings of a question's KG-Trie, as one typed component of the pipelines that decode through it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kglightning.data.kg import KGIndex
from kglightning.evidence.format import ConfidencePosition
from kglightning.llm.trie.kg_trie import KGTrie

__all__ = ["TrieConfig"]


@dataclass(frozen=True)
class TrieConfig:
    """Which evidence a question's KG-Trie admits (the arguments of :func:`~kglightning.llm.trie.valid_evidence`).

    In a config it is a nested group: ``trie: {max_hops: 4, max_constraints_per_path: 5}``; ``trie: null``
    decodes without a trie where the pipeline allows it.

    Args:
        max_hops: longest relation path in the trie.
        constraints: also admit the one-hop constraints of each path.
        max_paths: cap on the relation paths per question (``None``: all).
        max_constraints_per_path: cap on the constraints per path (``None``: all).
        confidence_position: where the proxy writes the confidence (:mod:`kglightning.evidence.format`); ``"after"``
            builds the trie for blocks that open with a bare ``<PATH>``.

    Example:
        >>> TrieConfig(max_hops=2)
        TrieConfig(max_hops=2, constraints=True, max_paths=2000, max_constraints_per_path=50, confidence_position='open')
    """

    max_hops: int = 4
    constraints: bool = True
    max_paths: int | None = 2000
    max_constraints_per_path: int | None = 50
    confidence_position: ConfidencePosition = "open"

    def __post_init__(self) -> None:
        if self.max_hops < 1:
            raise ValueError(f"max_hops must be >= 1, got {self.max_hops}")
        for name in ("max_paths", "max_constraints_per_path"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")

    def build(self, tokenizer: Any, kg: KGIndex, topics: str | Iterable[str]) -> KGTrie:
        """The trie of one question's graph from its topic entities."""
        return KGTrie.from_kg(
            tokenizer,
            kg,
            topics,
            self.max_hops,
            constraints=self.constraints,
            max_paths=self.max_paths,
            max_constraints_per_path=self.max_constraints_per_path,
            confidence_position=self.confidence_position,
        )
