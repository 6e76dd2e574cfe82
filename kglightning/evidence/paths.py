"""Grounding of constrained relational paths on a :class:`~kglightning.data.kg.KGIndex`, on integer ids.

Hops are *label ids* of the index's both-ways adjacency: a forward relation ``r`` is its relation id, a reverse
hop ``~r`` is ``relation id + num_relations``. Entity sets are sorted, duplicate-free ``int64`` arrays.
:class:`PathGrounder` follows many relation paths from one start set and walks each shared prefix once (a trie
of frontiers), so grounding all the paths mined for a question costs about one walk per distinct prefix.
:func:`score_constraints` rates every one-hop constraint around a grounded set in one vectorized pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kglightning.data.kg import KGIndex, is_reverse, reverse
from kglightning.data.kg_csr import csr_positions
from kglightning.evidence.confidence import beta_bernoulli_confidences

EMPTY = np.empty(0, dtype=np.int64)


def label_id(kg: KGIndex, relation: str) -> int | None:
    """The both-ways label id of a hop (``r`` or ``~r``), or ``None`` for a relation not in the graph.

    Example:
        >>> kg = KGIndex.from_triples([("a", "r", "b"), ("b", "s", "c")])
        >>> label_id(kg, "s"), label_id(kg, "~r"), label_id(kg, "t")
        (1, 2, None)
    """
    rid = kg._rid.get(reverse(relation) if is_reverse(relation) else relation)
    if rid is None:
        return None
    return rid + kg.num_relations if is_reverse(relation) else rid


def step(kg: KGIndex, ids: np.ndarray, label: int) -> np.ndarray:
    """Entities one hop of ``label`` away from ``ids`` (sorted unique ids).

    Args:
        kg: the graph index.
        ids: ``(n,)`` sorted unique entity ids.
        label: a both-ways label id (see :func:`label_id`).

    Example:
        >>> kg = KGIndex.from_triples([("a", "r", "b"), ("c", "r", "b")])
        >>> [kg.entities[i] for i in step(kg, step(kg, np.array([0]), 0), 1)]
        ['a', 'c']
    """
    if not ids.size:
        return EMPTY
    ptr, lab, dst = kg._both_csr()
    pos = csr_positions(ptr, ids)
    return np.unique(dst[pos[lab[pos] == label]])


def constraint_filter(kg: KGIndex, ids: np.ndarray, label: int | None, entity: int | None) -> np.ndarray:
    """The ids among ``ids`` with a ``label`` hop to ``entity`` (the constraint ``r_c(â, c)``).

    Computed from the constant's side: one reverse hop from ``entity``, intersected with ``ids``.

    Args:
        kg: the graph index.
        ids: ``(n,)`` sorted unique candidate ids.
        label: the constraint's label id from the answer side, or ``None`` (unknown relation: nothing passes).
        entity: the constant's id, or ``None`` (unknown entity: nothing passes).

    Example:
        >>> kg = KGIndex.from_triples([("x", "g", "M"), ("y", "g", "F")])
        >>> ids = np.array([kg.entity_id("x"), kg.entity_id("y")])
        >>> [kg.entities[i] for i in constraint_filter(kg, ids, label_id(kg, "g"), kg.entity_id("M"))]
        ['x']
    """
    if label is None or entity is None or not ids.size:
        return EMPTY
    back = (label + kg.num_relations) % (2 * kg.num_relations)
    return np.intersect1d(ids, step(kg, np.array([entity], dtype=np.int64), back), assume_unique=True)


class PathGrounder:
    """Follows relation paths from one start set, caching the frontier of every prefix.

    Args:
        kg: the graph index.
        start: ``(n,)`` sorted unique start ids (the topic entities).

    Example:
        >>> kg = KGIndex.from_triples([("q", "r", "m1"), ("q", "r", "m2"), ("m1", "s", "a"), ("m2", "t", "b")])
        >>> g = PathGrounder(kg, np.array([kg.entity_id("q")]))
        >>> [[kg.entities[i] for i in g.ground(p)] for p in (("r", "s"), ("r", "t"), ("r", "~s"))]
        [['a'], ['b'], []]
        >>> g.hops_walked  # 4 hops, not 6: the shared prefix ("r",) was walked once
        4
    """

    def __init__(self, kg: KGIndex, start: np.ndarray):
        self.kg = kg
        self._cache: dict[tuple[int, ...], np.ndarray] = {(): np.asarray(start, dtype=np.int64)}
        self.hops_walked = 0

    def ground_labels(self, labels: tuple[int, ...]) -> np.ndarray:
        """The end set of a path given as label ids (sorted unique ids)."""
        ids = self._cache.get(labels)
        if ids is None:
            prev = self.ground_labels(labels[:-1])
            ids = step(self.kg, prev, labels[-1]) if prev.size else EMPTY
            self.hops_walked += 1
            self._cache[labels] = ids
        return ids

    def ground(self, relations: Sequence[str]) -> np.ndarray:
        """The end set of a path given as relation names (``~r`` reverse); empty for an unknown relation."""
        labels = tuple(label_id(self.kg, r) for r in relations)
        if None in labels:
            return EMPTY
        return self.ground_labels(labels)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ConstraintScores:
    """Every one-hop constraint ``(label, entity)`` that keeps at least one answer of a grounded set.

    Attributes:
        label: ``(k,)`` label ids from the answer side.
        entity: ``(k,)`` constant entity ids.
        grounded: ``(k,)`` candidates left after the constraint.
        hits: ``(k,)`` answers left after the constraint (each >= 1).
        confidence: ``(k,)`` Beta-Bernoulli confidence of the constrained evidence.
    """

    label: np.ndarray
    entity: np.ndarray
    grounded: np.ndarray
    hits: np.ndarray
    confidence: np.ndarray

    def __len__(self) -> int:
        return int(self.label.size)


def score_constraints(
    kg: KGIndex, ids: np.ndarray, is_answer: np.ndarray, alpha: float = 0.5, beta: float = 0.5
) -> ConstraintScores:
    """Score all constraints drawn from the one-hop neighbourhood of the answers in ``ids``, in one pass.

    Every hop ``(label, c)`` leaving a candidate of ``ids`` is a constraint; it keeps the candidates with that hop.
    Only constraints that keep at least one gold answer are returned (a constraint from the neighbourhood of an
    answer outside ``ids`` would keep no answer). Sorted by (label, entity).

    Args:
        kg: the graph index.
        ids: ``(n,)`` sorted unique grounded candidate ids ``[[P_r]]``.
        is_answer: ``(num_entities,)`` bool mask of the gold answers.
        alpha: prior pseudo-count of correct candidates.
        beta: prior pseudo-count of wrong candidates.

    Example:
        >>> kg = KGIndex.from_triples([("q", "sib", "x"), ("q", "sib", "y"), ("x", "g", "M"), ("y", "g", "F")])
        >>> ids = np.array([kg.entity_id("x"), kg.entity_id("y")])
        >>> mask = np.isin(np.arange(kg.num_entities), [kg.entity_id("x")])
        >>> s = score_constraints(kg, ids, mask)
        >>> [(kg._labels[a], kg.entities[b], c) for a, b, c in zip(s.label, s.entity, s.confidence.tolist())]
        [('g', 'M', 0.75), ('~sib', 'q', 0.5)]
    """
    ptr, lab, dst = kg._both_csr()
    none = ConstraintScores(EMPTY, EMPTY, EMPTY, EMPTY, np.empty(0))
    if not ids.size:
        return none
    pos = csr_positions(ptr, ids)
    n = max(kg.num_entities, 1)
    key = lab[pos] * n + dst[pos]  # (candidate, key) pairs are unique: the both-ways rows hold no duplicates
    ans = is_answer[np.repeat(ids, ptr[ids + 1] - ptr[ids])]
    if not ans.any():
        return none
    order = np.argsort(key, kind="stable")
    key, ans = key[order], ans[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    hits = np.add.reduceat(ans.astype(np.int64), starts)
    grounded = np.diff(np.r_[starts, key.size])
    keep = hits > 0
    uniq, grounded, hits = key[starts[keep]], grounded[keep], hits[keep]
    conf = beta_bernoulli_confidences(hits, grounded, alpha, beta)
    return ConstraintScores(uniq // n, uniq % n, grounded, hits, conf)
