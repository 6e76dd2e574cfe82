"""Training pairs for UAG's relation scorer (UAG App. D); :class:`~kglightning.datamodules.RelationPairDataModule`
serves them.

UAG fine-tunes its SBERT encoder with ``CosineSimilarityLoss`` on pairs ``(Q || r_0 .. r_{j-1}, r_j)``: the question
followed by the relations walked so far, against the next relation. :func:`mine_relation_pairs` builds them from a
:class:`~kglightning.data.records.KGQARecord`:

* gold relation paths are the shortest topic -> answer relation paths of the record's subgraph (walking triples both
  ways; a reverse hop is written ``~r``), deduplicated, sorted and capped;
* every step ``j`` of a gold path gives a positive pair (label 1.0) for its next relation ``r_j``;
* negatives (label 0.0) are other relations that leave the entities reached by the prefix ``r_0 .. r_{j-1}``,
  excluding every gold next relation for that prefix, sampled without replacement.

The texts are :func:`~kglightning.data.text.step_query_text` and :func:`~kglightning.data.text.relation_text`,
exactly what the traversal that consumes the fine-tuned encoder compares.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.data.text import path_text, relation_text, step_query_text

__all__ = ["RelationPair", "collate_pairs", "gold_relation_paths", "mine_relation_pairs"]

PROGRESS_MIN_RECORDS = 500
"""Mining shows a progress bar from this many records on."""


@dataclass(frozen=True)
class RelationPair:
    """One (query, relation) pair for the relation scorer.

    Args:
        query: ``step_query_text(question, prefix)``.
        relation: ``relation_text(next_relation)``.
        label: 1.0 for a gold next relation, 0.0 for a negative.
        question_id: the id of the record it was mined from.
    """

    query: str
    relation: str
    label: float
    question_id: str


def gold_relation_paths(
    record: KGQARecord, kg: KGIndex | None = None, max_hops: int = 3, max_paths: int = 8
) -> list[tuple[str, ...]]:
    """The record's gold relation paths: shortest paths from each topic entity to each answer entity.

    Deduplicated, sorted by (length, relations) and capped at ``max_paths``; empty when no answer is within
    ``max_hops`` of a topic entity (or a topic entity is not in the graph).

    Example:
        >>> rec = KGQARecord(id="q", question="?", answer=["c"], q_entity=["a"], a_entity=["c"],
        ...                  graph=[["a", "r", "b"], ["c", "s", "b"]])
        >>> gold_relation_paths(rec)
        [('r', '~s')]
    """
    kg = KGIndex.from_record(record) if kg is None else kg
    found: set[tuple[str, ...]] = set()
    for topic in dict.fromkeys(record.q_entity):
        if topic not in kg:
            continue
        for answer in dict.fromkeys(record.a_entity):
            if answer == topic or answer not in kg:
                continue
            found.update(tuple(p) for p in kg.shortest_relation_paths(topic, answer, max_hops))
    return sorted(found, key=lambda p: (len(p), p))[:max_paths]


def mine_relation_pairs(
    record: KGQARecord,
    kg: KGIndex | None = None,
    max_hops: int = 3,
    negatives: int = 3,
    rng: random.Random | None = None,
    *,
    max_paths: int = 8,
    path_negatives: int = 0,
) -> list[RelationPair]:
    """Positive and negative ``(Q || r_0..r_{j-1}, r_j)`` pairs of one record (see the module docstring).

    Each distinct ``(prefix, next relation)`` of the gold paths gives one positive. Each distinct prefix gives up to
    ``negatives`` negatives per positive at that prefix, drawn without replacement from the relations (both
    directions) that leave the entities reached from the topic entities by the prefix, minus the gold next relations
    of that prefix. Pairs come in gold-path order: a prefix's positives, then its negatives.

    Args:
        record: the question with its subgraph.
        kg: the record's index, when already built (else built from ``record``).
        max_hops: longest gold path searched.
        negatives: negatives per positive.
        rng: the sampler; ``None`` seeds one from ``record.id`` (same pairs on every call).
        max_paths: most gold paths used.
        path_negatives: with ``> 0``, also whole-path pairs for Eq. 5: ``(Q, r_0 -> ... -> r_k)`` with label 1 for
            each gold path, and up to this many negatives per gold path, drawn from the non-gold relation paths of
            the same length that leave the topic entities (the paper trains step pairs only; ``0`` keeps that).

    Returns:
        The pairs; empty when the question has no gold path.

    Example:
        >>> rec = KGQARecord(id="q", question="capital of France?", answer=["Paris"], q_entity=["France"],
        ...                  a_entity=["Paris"], graph=[["France", "capital", "Paris"], ["France", "currency", "Euro"]])
        >>> [(p.query, p.relation, p.label) for p in mine_relation_pairs(rec)]
        [('capital of France?', 'capital', 1.0), ('capital of France?', 'currency', 0.0)]
    """
    kg = KGIndex.from_record(record) if kg is None else kg
    rng = random.Random(str(record.id)) if rng is None else rng
    gold = gold_relation_paths(record, kg, max_hops, max_paths)
    next_gold: dict[tuple[str, ...], list[str]] = {}  # prefix -> gold next relations, in gold-path order
    for path in gold:
        for j in range(len(path)):
            options = next_gold.setdefault(path[:j], [])
            if path[j] not in options:
                options.append(path[j])
    topics = [t for t in record.q_entity if t in kg]
    pairs: list[RelationPair] = []
    for prefix, positives in next_gold.items():
        query = step_query_text(record.question, prefix)
        pairs += [RelationPair(query, relation_text(r), 1.0, record.id) for r in positives]
        if negatives <= 0:
            continue
        excluded = set(positives)
        pool = sorted({r for e in kg.follow(topics, prefix) for r, _ in kg.edges(e)} - excluded)
        chosen = rng.sample(pool, min(len(pool), negatives * len(positives)))
        pairs += [RelationPair(query, relation_text(r), 0.0, record.id) for r in chosen]
    if path_negatives > 0 and gold:
        walks = kg.relation_paths(topics, max(len(p) for p in gold))
        gold_set = set(gold)
        pairs += [RelationPair(record.question, path_text(p), 1.0, record.id) for p in gold]
        for length in sorted({len(p) for p in gold}):
            n_gold = sum(len(p) == length for p in gold)
            pool = sorted(p for p in walks if len(p) == length and p not in gold_set)
            chosen = rng.sample(pool, min(len(pool), path_negatives * n_gold))
            pairs += [RelationPair(record.question, path_text(p), 0.0, record.id) for p in chosen]
    return pairs


def collate_pairs(pairs: Sequence[RelationPair]) -> dict:
    """A batch dict ``{"query": list[str], "relation": list[str], "label": FloatTensor}``."""
    return {
        "query": [p.query for p in pairs],
        "relation": [p.relation for p in pairs],
        "label": torch.tensor([p.label for p in pairs], dtype=torch.float32),
    }
