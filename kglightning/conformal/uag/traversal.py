"""UAG's uncertainty-aware candidate retriever and evaluator (Algorithm 1; Eqs. 4-6), run on the graph.

The search is breadth-first and deterministic. A state is a relation path from the topic entities together with
the entities it reaches (the first state is the empty path at the topic entities). Popping a state, each relation
``r`` leaving its entities (both directions, in relation order) is scored twice:

* Eq. 4: if ``1 - cos(Q || path, r) <= q1`` (and the longer path is within ``max_hops``) the state
  ``(path + r, reached entities)`` is queued;
* Eq. 5: if ``1 - cos(Q, path + r) <= q2`` the reached entities join the candidate set, with ``path + r`` as the
  path that admitted them.

Then (Eq. 6) the candidates with ``1 - cos(a, Phi) <= q3`` form the prediction set, ``Phi`` being the LLM's answer
or, without an LLM, the question (see :mod:`.scores`). The walk never re-enters a topic entity, the rule of
:func:`~kglightning.data.kg_paths.relation_paths`, so its sets are exactly those of :mod:`.grid` for the same
thresholds (UAG's reference code skips neighbours at random; this search has no random step, which keeps the
calibration and test questions exchangeable).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from kglightning.conformal.uag.scores import evaluator_scores, path_scores, step_scores, topic_entities
from kglightning.data.embeddings import EmbeddingCache, TransientEmbeddings
from kglightning.data.kg import KGIndex
from kglightning.data.kg_paths import _expand
from kglightning.data.records import KGQARecord


@dataclass
class TraversalResult:
    """What one search returned.

    Attributes:
        answers: the prediction set (Eq. 6 applied), sorted by evaluator score then name.
        scores: evaluator score of each answer, aligned with ``answers``.
        candidates: the candidate set before Eq. 6 (sorted names).
        paths: for each candidate, the relation paths that admitted it (Eq. 5), in search order.
        expanded: number of states popped from the queue.
        scored: number of (state, relation) pairs scored.
    """

    answers: list[str]
    scores: list[float]
    candidates: list[str]
    paths: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)
    expanded: int = 0
    scored: int = 0


class UAGTraversal:
    """Runs Algorithm 1 for one question at fixed thresholds.

    Args:
        cache: text embeddings of the relation scorer's encoder (normalised).
        max_hops: longest relation path walked.
    """

    def __init__(self, cache: EmbeddingCache, max_hops: int = 3) -> None:
        if max_hops < 1:
            raise ValueError(f"max_hops must be >= 1, got {max_hops}")
        self.cache = cache
        self.max_hops = max_hops

    def run(
        self,
        record: KGQARecord,
        q1: float,
        q2: float,
        q3: float,
        *,
        kg: KGIndex | None = None,
        llm_answer: str | None = None,
        scratch: TransientEmbeddings | EmbeddingCache | None = None,
    ) -> TraversalResult:
        """The prediction set of ``record`` at thresholds ``(q1, q2, q3)`` (``inf`` disables a filter).

        ``scratch`` embeds the step queries and path texts (:func:`~kglightning.conformal.uag.scores.step_scores`);
        pass the one that :func:`~kglightning.conformal.uag.scores.score_questions` filled for the same question
        (or the cache, when it stored them), so that the walk and the grid read the same rows."""
        scratch = scratch if scratch is not None else TransientEmbeddings(self.cache)
        kg = kg or KGIndex.from_record(record)
        topics = topic_entities(record, kg)
        start = kg._ids(topics)
        banned = np.zeros(kg.num_entities, dtype=bool)
        banned[start] = True
        q_emb = self.cache.embed([record.question])[0]
        admitted: dict[int, list[tuple[str, ...]]] = {}
        queue: deque[tuple[tuple[str, ...], np.ndarray]] = deque([((), start)] if start.size else [])
        expanded = scored = 0
        while queue:
            prefix, ids = queue.popleft()
            expanded += 1
            moves = [(kg._labels[label], dst) for label, dst in _expand(kg, ids, None, banned)]
            if not moves:
                continue
            relations = [r for r, _ in moves]
            scored += len(moves)
            longer = [prefix + (r,) for r in relations]
            s5 = path_scores(self.cache, q_emb, longer, scratch).tolist()
            can_grow = len(prefix) + 1 < self.max_hops
            s4 = (
                step_scores(self.cache, record.question, [prefix] * len(moves), relations, scratch).tolist()
                if can_grow
                else []
            )
            for m, (path, (_, dst)) in enumerate(zip(longer, moves)):
                if s5[m] <= q2:
                    for e in dst.tolist():
                        admitted.setdefault(e, []).append(path)
                if can_grow and s4[m] <= q1:
                    queue.append((path, dst))
        names = {kg._entities[e]: paths for e, paths in admitted.items()}
        candidates = sorted(names)
        s6 = evaluator_scores(self.cache, candidates, record.question, llm_answer).tolist()
        kept = sorted((s, a) for a, s in zip(candidates, s6) if s <= q3)
        return TraversalResult(
            answers=[a for _, a in kept],
            scores=[round(s, 6) for s, _ in kept],
            candidates=candidates,
            paths=names,
            expanded=expanded,
            scored=scored,
        )


def as_thresholds(*values: float | torch.Tensor) -> tuple[float, ...]:
    """Plain floats of threshold values (tensors or floats)."""
    return tuple(float(v) for v in values)
