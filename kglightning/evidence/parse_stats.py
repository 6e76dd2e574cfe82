"""Counts of parsed items and of their issues, shared by the evidence parser and the reasoner-answer parser."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol


class _HasIssues(Protocol):
    issues: list[str]


@dataclass
class ParseStats:
    """Counts, over a run, of parsed items and of their issues by reason.

    An *item* is one parsed output (a reasoner answer, or one generated evidence text); ``clean`` counts the items
    without any issue; ``reasons`` counts every issue occurrence. Stats from several workers add up with ``+``.

    Example:
        >>> stats = ParseStats()
        >>> stats.record(["missing_confidence", "missing_confidence"])
        >>> stats.record([])  # an item without issues
        >>> stats.total, stats.clean, stats.count("missing_confidence"), stats.rate("missing_confidence")
        (2, 1, 2, 1.0)
        >>> stats.as_dict(prefix="answers/")
        {'answers/total': 2, 'answers/clean': 1, 'answers/missing_confidence': 2}
        >>> (stats + stats).total
        4
    """

    total: int = 0
    clean: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def record(self, item: Iterable[str] | _HasIssues) -> None:
        """Count one parsed item, given as its list of issues or as a result with an ``issues`` attribute."""
        issues = list(item.issues if hasattr(item, "issues") else item)  # type: ignore[union-attr]
        self.total += 1
        self.clean += not issues
        self.reasons.update(issues)

    def count(self, reason: str) -> int:
        """How many times ``reason`` occurred."""
        return self.reasons[reason]

    def rate(self, reason: str) -> float:
        """Occurrences of ``reason`` per item (``0.0`` before any item)."""
        return self.reasons[reason] / self.total if self.total else 0.0

    def merge(self, other: ParseStats) -> ParseStats:
        """Add ``other`` into ``self`` in place and return ``self``."""
        self.total += other.total
        self.clean += other.clean
        self.reasons.update(other.reasons)
        return self

    def __add__(self, other: ParseStats) -> ParseStats:
        return ParseStats(self.total, self.clean, Counter(self.reasons)).merge(other)

    def as_dict(self, prefix: str = "") -> dict[str, int]:
        """Flat counts for a logger: ``total``, ``clean``, then one key per reason (sorted)."""
        out = {f"{prefix}total": self.total, f"{prefix}clean": self.clean}
        out.update({f"{prefix}{k}": v for k, v in sorted(self.reasons.items())})
        return out

    def __str__(self) -> str:
        parts = ", ".join(f"{k}={v}" for k, v in self.reasons.most_common())
        return f"{self.total} parsed, {self.clean} clean" + (f"; {parts}" if parts else "")
