"""What an LLM's output says about each of its answers, for free: votes, first rank, cited paths.

Many KGQA systems return several answers per question, from ``k`` beams or samples, and cite the reasoning path
behind each (GCR writes ``# Reasoning Path: ... # Answer: ...`` per beam). A record keeps them as ``prediction``
(one entry per beam or sample, repeats kept: a repeat is a vote) and ``prediction_paths`` (the paths each entry
cites). Grouping the entries that name the same answer gives per-answer signals that cost nothing to compute and
that both the detector (``DetectionDataModule(answer_features=[...])``) and the structural baseline
(``StructuralBaseline(signals=[...])``) read, so that their comparison stays fair.

Each signal is a bounded or log-scaled number, ready to be a classifier input:

* ``votes``: the share of the record's entries that name the answer;
* ``first_rank``: the position of its first entry over the number of entries (0 = first);
* ``log_answers``: ``log(1 + entries)``, how long the LLM's list is;
* ``cited_paths``: ``log(1 + distinct paths cited for it)``;
* ``cited_in_graph``: the share of those paths whose every hop is a triple of the question's graph, read in either
  direction (0 when none is cited);
* ``log_degree``: ``log(1 + edges at its node)`` (0 for an answer that names no node);
* ``log_graph_size``: ``log(1 + triples of the graph)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

__all__ = ["LLM_SIGNALS", "SIGNALS", "AnswerSignals", "LLMSignal", "Signal", "path_triples"]

Signal = Literal["votes", "first_rank", "log_answers", "cited_paths", "cited_in_graph", "log_degree", "log_graph_size"]
SIGNALS: tuple[Signal, ...] = (
    "votes",
    "first_rank",
    "log_answers",
    "cited_paths",
    "cited_in_graph",
    "log_degree",
    "log_graph_size",
)
LLMSignal = Literal["votes", "first_rank", "log_answers", "cited_paths", "cited_in_graph"]
#: the signals read from the LLM's output alone (the others are counts of the graph)
LLM_SIGNALS: tuple[LLMSignal, ...] = ("votes", "first_rank", "log_answers", "cited_paths", "cited_in_graph")


def path_triples(path: Sequence[str]) -> list[tuple[str, str, str]]:
    """The hops ``(e_i, r_i+1, e_i+1)`` of a path written ``[e0, r1, e1, ..., rn, en]``.

    Example:
        >>> path_triples(["Jamaica", "language", "English", "family", "Germanic"])
        [('Jamaica', 'language', 'English'), ('English', 'family', 'Germanic')]
    """
    return [(path[i], path[i + 1], path[i + 2]) for i in range(0, len(path) - 2, 2)]


class AnswerSignals:
    """The signals of one record's answers; build once per record, then ask per answer.

    Args:
        record: a :class:`~kglightning.data.records.KGQARecord` (its ``prediction``, ``prediction_paths`` and
            ``graph`` are read).

    Example:
        >>> from kglightning.data.records import KGQARecord
        >>> r = KGQARecord("q", "language of Jamaica?", ["English"], ["Jamaica"], ["English"],
        ...     [("Jamaica", "language", "English")], prediction=["English", "Patois", "English"],
        ...     prediction_paths=[[["Jamaica", "language", "English"]], [["Jamaica", "anthem", "Patois"]], []])
        >>> s = AnswerSignals(r)
        >>> [round(v, 3) for v in s.values([0, 2], degree=1)]  # two of three entries; one path, in the graph
        [0.667, 0.0, 1.386, 0.693, 1.0, 0.693, 0.693]
        >>> s.values([1], degree=None, names=["cited_paths", "cited_in_graph"])  # a path that is not in the graph
        [0.6931471805599453, 0.0]
    """

    def __init__(self, record: Any) -> None:
        self.record = record
        self.entries = len(record.prediction or [])
        self.cited = getattr(record, "prediction_paths", None)
        self._triples: set[tuple[str, str, str]] | None = None

    def in_graph(self, path: Sequence[str]) -> bool:
        """Whether every hop of ``path`` is a triple of the graph, in either direction."""
        if self._triples is None:  # built on first use: most records cite no path
            self._triples = set(map(tuple, self.record.graph))
        triples = self._triples
        return all((h, r, t) in triples or (t, r, h) in triples for h, r, t in path_triples(path))

    def cited_paths(self, entries: Iterable[int]) -> list[Sequence[str]]:
        """The distinct paths cited by ``entries`` (indices into ``prediction``), in order of first citation."""
        paths: dict[tuple[str, ...], Sequence[str]] = {}
        for k in entries:
            for p in self.cited[k] if self.cited is not None and k < len(self.cited) else ():
                paths.setdefault(tuple(p), p)
        return list(paths.values())

    def values(self, entries: Iterable[int], degree: int | None, names: Sequence[Signal] = SIGNALS) -> list[float]:
        """The ``names`` signals of the answer made of ``entries`` (indices into ``prediction``); ``degree``: the
        edges at its node (``None``: it names no node of the graph)."""
        entries = sorted(set(entries))
        if not entries:
            raise ValueError("an answer needs at least one entry of the prediction")
        n = max(self.entries, 1)
        paths = self.cited_paths(entries) if {"cited_paths", "cited_in_graph"} & set(names) else []
        value = {
            "votes": lambda: len(entries) / n,
            "first_rank": lambda: entries[0] / n,
            "log_answers": lambda: math.log1p(self.entries),
            "cited_paths": lambda: math.log1p(len(paths)),
            "cited_in_graph": lambda: sum(map(self.in_graph, paths)) / len(paths) if paths else 0.0,
            "log_degree": lambda: math.log1p(degree) if degree is not None else 0.0,
            "log_graph_size": lambda: math.log1p(len(self.record.graph)),
        }
        unknown = [x for x in names if x not in value]
        if unknown:
            raise ValueError(f"unknown answer signal {unknown[0]!r}; known: {', '.join(SIGNALS)}")
        return [float(value[x]()) for x in names]
