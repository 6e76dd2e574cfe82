"""Mining, grounding and scoring of constrained relational paths for one question (DoublyCal §4.1, App. D.2).

Mining (training data, needs the gold answers ``A``): for each topic entity ``q`` of the question, the relation
sequences of all shortest ``q``-``a`` paths (≤ ``max_hops``, walking triples both ways) for every answer ``a`` come
from one shared search (:func:`~kglightning.data.kg_paths.shortest_relation_paths_many`). Each path ``P_r`` is
grounded from ``q`` (:class:`~kglightning.evidence.paths.PathGrounder` walks shared prefixes once) and scored
with Eq. 4. Candidate constraints ``C`` are the one-hop neighbours ``(r_c, c)`` of the gold answers that ``P_r``
reaches; ``P_r ∧ C`` is kept only when its confidence is strictly higher than that of ``P_r`` alone.

Grounding ``[[z]]`` follows ``P_r`` from the topic entity (every topic entity when ``z.topic is None``) over the
full graph, with no distinctness condition on the intermediate entities (``P_r`` is an existential conjunction),
then keeps the candidates that satisfy the constraint.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

from kglightning.data.kg import KGIndex
from kglightning.data.kg_paths import shortest_relation_paths_many
from kglightning.data.records import KGQARecord
from kglightning.evidence.confidence import beta_bernoulli_confidence
from kglightning.evidence.paths import EMPTY, PathGrounder, constraint_filter, label_id, score_constraints
from kglightning.evidence.schema import Evidence

CVT_PATTERN = re.compile(r"^[mg]\.[0-9a-z_]+$")
"""Freebase machine ids (``m.0abc``, ``g.11b...``): CVT and unnamed nodes, never useful as a constraint constant."""

_EPS = 1e-12


def _by_length(item: tuple[tuple[int, ...], tuple[str, ...]]) -> tuple[int, tuple[int, ...]]:
    return len(item[0]), item[0]


class EvidenceBuilder:
    """Constrained relational paths with Beta-Bernoulli confidence, for one KGQA record at a time.

    Args:
        max_hops: longest relation path mined (the paper's A* depth, 4).
        alpha: Beta prior pseudo-count of correct candidates (Jeffreys: 0.5).
        beta: Beta prior pseudo-count of wrong candidates (Jeffreys: 0.5).
        max_constraints: constrained variants kept per path, best confidence first (0 mines bare paths only).
        max_paths: cap on the relation paths per (topic, answer) pair, as in
            :meth:`~kglightning.data.kg.KGIndex.shortest_relation_paths` (guards against hub explosions).
        skip_cvt_constraints: never use a CVT / machine-id entity (:data:`CVT_PATTERN`) as a constraint constant.
        answer_constraints: allow a gold answer as a constraint constant (off by default: the evidence would name
            an answer, which a proxy cannot know at inference).

    Example:
        >>> rec = KGQARecord("q1", "What is the name of Snoopy's brother?", ["Spike"], ["Snoopy"], ["Spike"],
        ...     [("Snoopy", "sibling_of", "Spike"), ("Snoopy", "sibling_of", "Belle"),
        ...      ("Spike", "gender", "Male"), ("Belle", "gender", "Female")])
        >>> for z in EvidenceBuilder().mine(rec):
        ...     print(z)
        Snoopy -> sibling_of (0.5)
        Snoopy -> sibling_of [gender Male] (0.75)
        >>> sorted(EvidenceBuilder().ground(rec, Evidence(None, ("sibling_of",))))
        ['Belle', 'Spike']
    """

    def __init__(
        self,
        max_hops: int = 4,
        alpha: float = 0.5,
        beta: float = 0.5,
        max_constraints: int = 3,
        max_paths: int = 1000,
        skip_cvt_constraints: bool = True,
        answer_constraints: bool = False,
    ):
        if max_hops < 1:
            raise ValueError(f"max_hops must be >= 1, got {max_hops}")
        if not (alpha > 0 and beta > 0):
            raise ValueError(f"alpha and beta must be > 0, got alpha={alpha!r}, beta={beta!r}")
        if max_constraints < 0 or max_paths < 1:
            raise ValueError(f"need max_constraints >= 0 and max_paths >= 1, got {max_constraints}, {max_paths}")
        self.max_hops = max_hops
        self.alpha = alpha
        self.beta = beta
        self.max_constraints = max_constraints
        self.max_paths = max_paths
        self.skip_cvt_constraints = skip_cvt_constraints
        self.answer_constraints = answer_constraints
        self._last: tuple[object, KGIndex] | None = None

    def index(self, record: KGQARecord) -> KGIndex:
        """The :class:`KGIndex` of ``record.graph``; the last one is cached (by identity of the graph list)."""
        if self._last is None or self._last[0] is not record.graph:
            self._last = (record.graph, KGIndex.from_record(record))
        return self._last[1]

    def confidence(self, hits: int, grounded: int) -> float:
        """Eq. 4 with this builder's prior: ``(alpha + hits) / (alpha + beta + grounded)``."""
        return beta_bernoulli_confidence(hits, grounded, self.alpha, self.beta)

    def shortest_paths(
        self, record: KGQARecord, answers: Iterable[str] | None = None
    ) -> dict[tuple[str, str], list[tuple[str, ...]]]:
        """The mined relation paths per ``(topic, answer)`` pair (both in the graph, ``topic != answer``).

        Args:
            record: the question with its graph.
            answers: gold answer entities; ``record.a_entity`` by default.

        Returns:
            ``{(topic, answer): [relation path, ...]}``, each list in the order of
            :meth:`KGIndex.shortest_relation_paths` (``[]`` when farther than ``max_hops``).
        """
        kg = self.index(record)
        targets = [a for a in dict.fromkeys(record.a_entity if answers is None else answers) if a in kg]
        out: dict[tuple[str, str], list[tuple[str, ...]]] = {}
        for topic in dict.fromkeys(record.q_entity):
            if topic not in kg:
                continue
            found = shortest_relation_paths_many(kg, topic, targets, self.max_hops, self.max_paths)
            out.update(((topic, a), ps) for a, ps in found.items() if a != topic)
        return out

    def mine(self, record: KGQARecord, answers: Iterable[str] | None = None) -> list[Evidence]:
        """Training evidence for one question: scored paths, each followed by its kept constrained variants.

        Args:
            record: the question with its graph.
            answers: gold answer entities; ``record.a_entity`` by default.

        Returns:
            Per topic entity (in ``record.q_entity`` order), the distinct shortest relation paths to any answer,
            shortest first then in relation-id order, each as a scored :class:`Evidence` followed by up to
            ``max_constraints`` constrained ones (highest confidence first). ``[]`` when no topic entity or no
            answer is in the graph.
        """
        kg = self.index(record)
        gold = list(dict.fromkeys(record.a_entity if answers is None else answers))
        is_answer = np.zeros(kg.num_entities, dtype=bool)
        is_answer[kg._ids(gold)] = True
        by_pair = self.shortest_paths(record, gold)
        out: list[Evidence] = []
        for topic in dict.fromkeys(record.q_entity):
            if topic not in kg:
                continue
            rel_paths = {p: None for (t, _), ps in by_pair.items() if t == topic for p in ps if p}
            labelled = sorted(((tuple(label_id(kg, r) for r in p), p) for p in rel_paths), key=_by_length)
            grounder, cache = PathGrounder(kg, kg._ids(topic)), {}
            for labels, path in labelled:
                ids = grounder.ground_labels(labels)
                hits = int(is_answer[ids].sum())
                base = Evidence(topic, path, None, self.confidence(hits, ids.size), int(ids.size), hits)
                out.append(base)
                out.extend(self._constraints(kg, base, ids, is_answer, cache))
        return out

    def _constraints(
        self, kg: KGIndex, base: Evidence, ids: np.ndarray, is_answer: np.ndarray, cache: dict
    ) -> list[Evidence]:
        if not self.max_constraints or base.hits == base.grounded:
            return []  # no wrong candidate to filter out: no constraint can raise the confidence
        key = ids.tobytes()  # paths that ground to the same set (parallel relations) share the scores
        if key not in cache:
            cache[key] = score_constraints(kg, ids, is_answer, self.alpha, self.beta)
        s = cache[key]
        keep = s.confidence > base.confidence + _EPS
        if not self.answer_constraints:
            keep &= ~is_answer[s.entity]
        idx = np.flatnonzero(keep)
        idx = idx[np.lexsort((s.entity[idx], s.label[idx], -s.hits[idx], -s.confidence[idx]))]
        out: list[Evidence] = []
        for i in idx.tolist():
            entity = kg._entities[s.entity[i]]
            if self.skip_cvt_constraints and CVT_PATTERN.match(entity):
                continue
            constraint = (kg._labels[s.label[i]], entity)
            out.append(
                Evidence(
                    base.topic, base.relations, constraint, float(s.confidence[i]), int(s.grounded[i]), int(s.hits[i])
                )
            )
            if len(out) == self.max_constraints:
                break
        return out

    def _ground_ids(self, kg: KGIndex, grounder: PathGrounder, evidence: Evidence) -> np.ndarray:
        ids = grounder.ground(evidence.relations)
        if evidence.constraint is not None:
            rel, ent = evidence.constraint
            ids = constraint_filter(kg, ids, label_id(kg, rel), kg.entity_id(ent))
        return ids

    def _ground_many(
        self, record: KGQARecord, evidence: Sequence[Evidence], kg: KGIndex | None = None
    ) -> tuple[KGIndex, list[np.ndarray]]:
        kg = self.index(record) if kg is None else kg
        grounders: dict[str | None, PathGrounder] = {}
        out = []
        for z in evidence:
            if z.topic not in grounders:
                topics = record.q_entity if z.topic is None else [z.topic]
                grounders[z.topic] = PathGrounder(kg, kg._ids(topics) if topics else EMPTY)
            out.append(self._ground_ids(kg, grounders[z.topic], z))
        return kg, out

    def ground(self, record: KGQARecord, evidence: Evidence) -> set[str]:
        """``[[z]]``: the candidate answers of ``evidence`` in ``record``'s graph (names).

        Unknown topics, relations or constraint entities give an empty set, never an error.
        """
        return self.ground_all(record, [evidence])[0]

    def ground_all(self, record: KGQARecord, evidence: Sequence[Evidence], kg: KGIndex | None = None) -> list[set[str]]:
        """:meth:`ground` for several evidences of one question, walking shared path prefixes once.

        ``kg`` is the record's graph index when the caller has already built it (otherwise :meth:`index`).
        """
        kg, sets = self._ground_many(record, evidence, kg)
        return [{kg._entities[i] for i in ids.tolist()} for ids in sets]

    def score(self, record: KGQARecord, evidence: Evidence, answers: Iterable[str] | None = None) -> Evidence:
        """``evidence`` with its Bayesian confidence and grounding counts against the gold answers.

        Args:
            record: the question with its graph.
            evidence: the evidence to score (e.g. generated by a proxy); its own confidence is ignored.
            answers: gold answer entities; ``record.a_entity`` by default.
        """
        return self.score_all(record, [evidence], answers)[0]

    def score_all(
        self, record: KGQARecord, evidence: Sequence[Evidence], answers: Iterable[str] | None = None
    ) -> list[Evidence]:
        """:meth:`score` for several evidences of one question."""
        kg, sets = self._ground_many(record, evidence)
        gold = kg._ids(record.a_entity if answers is None else answers)
        out = []
        for z, ids in zip(evidence, sets):
            hits = int(np.isin(ids, gold, assume_unique=True).sum())
            out.append(z.scored(self.confidence(hits, ids.size), ids.size, hits))
        return out
