"""UAG's non-conformity scores for one question, computed once for every relation path within ``max_hops``.

All scores are ``1 - cosine similarity`` under the relation scorer's sentence encoder (lower = more conforming):

* **step score** (Eq. 4): ``1 - cos(Q || r_0 || ... || r_{j-1}, r_j)`` for hop ``j`` of a path.
* ``expand[p]``: the largest step score over the hops of path ``p`` *before its last one*. The traversal reaches
  the node from which ``p``'s last hop leaves iff every earlier hop passed Eq. 4, i.e. iff
  ``expand[p] <= q1`` (``-inf`` for 1-hop paths, which leave a topic entity directly).
* ``path_score[p]`` (Eq. 5): ``1 - cos(Q, r_0 -> ... -> r_k)``; the path's end entities enter the candidate set
  iff ``path_score[p] <= q2``.
* ``evaluator[a]`` (Eq. 6): ``1 - cos(a, Phi(P))``, the distance between the candidate's name and the reasoner
  LLM's answer over the retrieved paths. **Without an LLM** (or when it gave no answer) the question itself stands
  in for ``Phi(P)``: the candidate is scored directly by ``1 - cos(a, Q)``. Either way the score does not depend on
  the thresholds, so one LLM call per question serves a whole grid of configurations.

So entity ``a`` is in UAG's set at thresholds ``(q1, q2, q3)`` iff some path ``p`` reaching it has
``expand[p] <= q1`` and ``path_score[p] <= q2``, and ``evaluator[a] <= q3``; :mod:`.grid` evaluates that for a whole
grid of thresholds at once and :mod:`.traversal` runs the breadth-first search itself.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, overload

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from kglightning.data.embeddings import EmbeddingCache, TransientEmbeddings
from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.data.text import path_text, relation_text, step_query_text

Coverage = Literal["any", "all"]

log = logging.getLogger(__name__)


Path = tuple[str, ...]


class PathTable:
    """One object per distinct relation path, shared by the questions scored together: relation paths repeat from
    question to question (a split has far fewer distinct paths than questions x paths), so each question keeps an
    ``int32`` id per path (4 bytes) instead of a tuple of its own (about 70)."""

    def __init__(self) -> None:
        self.paths: list[Path] = []
        self._ids: dict[Path, int] = {}

    def __len__(self) -> int:
        return len(self.paths)

    def ids(self, paths: Iterable[Path]) -> np.ndarray:
        """``int32`` ids of ``paths``, adding the new ones."""
        out = []
        for p in paths:
            i = self._ids.get(p)
            if i is None:
                i = self._ids[p] = len(self.paths)
                self.paths.append(p)
            out.append(i)
        return np.asarray(out, dtype=np.int32)


class PathList(Sequence[Path]):
    """A question's relation paths as ids into a :class:`PathTable`: reads as a list of tuples (``len``, indexing,
    iteration, ``==`` with a list).

    Example:
        >>> table = PathTable()
        >>> paths = PathList(table, [("r",), ("r", "s")])
        >>> paths[1], len(paths), paths == [("r",), ("r", "s")], PathList(table, [("r",)]).ids.tolist()
        (('r', 's'), 2, True, [0])
    """

    __slots__ = ("ids", "table")

    def __init__(self, table: PathTable, paths: Iterable[Path]) -> None:
        self.table = table
        self.ids = table.ids(paths)

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> Path: ...
    @overload
    def __getitem__(self, i: slice) -> list[Path]: ...
    def __getitem__(self, i: int | slice) -> Path | list[Path]:
        if isinstance(i, slice):
            return [self.table.paths[j] for j in self.ids[i].tolist()]
        return self.table.paths[int(self.ids[i])]

    def __iter__(self) -> Iterator[Path]:
        return (self.table.paths[j] for j in self.ids.tolist())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # mutable table, compared by value

    def __repr__(self) -> str:
        return f"PathList({list(self)!r})"


@dataclass
class QuestionScores:
    """Every score UAG needs for one question (see the module docstring).

    Attributes:
        qid: record id.
        entities: the candidate pool: every entity reached by a path (topic entities excluded), sorted.
        paths: the relation paths, shortest first (``~r`` = reverse hop); a list of tuples, or from
            :func:`score_questions` a :class:`PathList` sharing one :class:`PathTable` across the questions.
        expand: ``(P,)`` Eq. 4 score needed to reach the start of each path's last hop.
        path_score: ``(P,)`` Eq. 5 score of each path.
        incidence: ``(2, nnz)`` integer (``int32`` from :func:`score_question`): ``[path index, entity index]``
            for each end entity of each path.
        evaluator: ``(A,)`` Eq. 6 score of each entity.
        gold: ``(A,)`` bool, entity is a gold answer.
        n_gold: number of gold answers of the question (some may be outside the pool).
        llm_answer: the LLM's answer text (``None`` without an LLM).
    """

    qid: str
    entities: list[str]
    paths: Sequence[Path]
    expand: Tensor
    path_score: Tensor
    incidence: Tensor
    evaluator: Tensor
    gold: Tensor
    n_gold: int
    llm_answer: str | None = None

    @property
    def num_entities(self) -> int:
        return len(self.entities)

    def entity_path_min(self, values: Tensor) -> Tensor:
        """Per entity, the minimum of a per-path ``values`` over the paths reaching it (``+inf`` if none)."""
        out = torch.full((self.num_entities,), float("inf"), dtype=values.dtype, device=values.device)
        if self.incidence.numel():
            out = out.scatter_reduce(0, self.incidence[1].long(), values[self.incidence[0]], reduce="amin")
        return out

    def component_scores(self, coverage: Coverage = "any") -> Tensor:
        """Calibration scores ``(3,)`` of the three components for this question.

        Per gold entity, the smallest score that lets a component keep it; then the smallest over gold entities
        (``coverage="any"``: one gold answer suffices) or the largest (``"all"``). ``+inf`` when the pool misses
        the gold answers (every one for ``"any"``, at least one for ``"all"``).
        """
        per_entity = torch.stack(
            [self.entity_path_min(self.expand), self.entity_path_min(self.path_score), self.evaluator]
        )
        gold = per_entity[:, self.gold]
        if gold.shape[1] == 0 or (coverage == "all" and int(self.gold.sum()) < self.n_gold):
            return torch.full((3,), float("inf"), dtype=per_entity.dtype, device=per_entity.device)
        return gold.min(dim=1).values if coverage == "any" else gold.max(dim=1).values


def topic_entities(record: KGQARecord, kg: KGIndex) -> list[str]:
    """The record's topic entities that exist in its graph, in record order."""
    return [e for e in dict.fromkeys(record.q_entity) if e in kg]


def cosine_distance(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise ``1 - a . b`` for normalised embeddings (``b`` broadcasts). One formula everywhere, so the traversal
    and the grid compute bit-identical scores."""
    return (1.0 - (a * b).sum(dim=-1)).float()


def step_scores(
    cache: EmbeddingCache,
    question: str,
    prefixes: Sequence[tuple[str, ...]],
    relations: Sequence[str],
    queries: TransientEmbeddings | None = None,
) -> Tensor:
    """Eq. 4 scores ``1 - cos(Q || prefix_i, relation_i)`` for aligned lists of prefixes and next relations.

    The ``Q || prefix`` texts hold the question, so no other question asks for them: they are embedded through
    ``queries`` (not stored in the disk cache; a fresh :class:`TransientEmbeddings` when ``None``)."""
    if not prefixes:
        return torch.zeros(0, device="cpu")
    left = (queries or TransientEmbeddings(cache)).embed([step_query_text(question, p) for p in prefixes])
    return cosine_distance(left, cache.embed([relation_text(r) for r in relations]))


def path_scores(cache: EmbeddingCache, q_emb: Tensor, paths: Sequence[tuple[str, ...]]) -> Tensor:
    """Eq. 5 scores ``1 - cos(Q, path)`` of relation paths."""
    return cosine_distance(cache.embed([path_text(p) for p in paths]), q_emb) if paths else torch.zeros(0, device="cpu")


def evaluator_scores(cache: EmbeddingCache, entities: Sequence[str], question: str, llm_answer: str | None) -> Tensor:
    """Eq. 6 scores ``1 - cos(a, Phi)`` of candidate names; ``Phi`` is the LLM answer, or the question without one."""
    if not entities:
        return torch.zeros(0, device="cpu")
    anchor = llm_answer.strip() if llm_answer is not None and llm_answer.strip() else question
    return cosine_distance(cache.embed(entities), cache.embed([anchor])[0])


def _walks(record: KGQARecord, kg: KGIndex, max_hops: int, max_paths: int | None) -> dict[tuple[str, ...], set[str]]:
    topics = topic_entities(record, kg)
    walks = kg.relation_paths(topics, max_hops, max_paths) if topics else {}
    if max_paths is not None and len(walks) >= max_paths:
        log.warning("question %s: path enumeration stopped at max_paths=%d", record.id, max_paths)
    return walks


def _texts(record: KGQARecord, walks: dict[tuple[str, ...], set[str]], llm_answer: str | None) -> list[str]:
    """The strings :func:`score_question` embeds for ``record`` that the disk cache keeps (its step queries,
    :func:`_query_texts`, are not kept)."""
    texts = [record.question, *(llm_answer.strip() for _ in [0] if llm_answer and llm_answer.strip())]
    texts += [path_text(p) for p in walks]
    texts += [relation_text(p[j]) for p in walks for j in range(len(p) - 1)]
    texts += sorted(set().union(*walks.values())) if walks else []
    return texts


def _query_texts(record: KGQARecord, walks: dict[tuple[str, ...], set[str]]) -> set[str]:
    """The Eq. 4 step queries ``Q || r_0 || ... || r_{j-1}`` of ``record``'s paths."""
    return {step_query_text(record.question, p[:j]) for p in walks for j in range(len(p) - 1)}


def score_question(
    record: KGQARecord,
    cache: EmbeddingCache,
    *,
    max_hops: int = 3,
    max_paths: int | None = 5000,
    kg: KGIndex | None = None,
    llm_answer: str | None = None,
    walks: dict[tuple[str, ...], set[str]] | None = None,
    queries: TransientEmbeddings | None = None,
    path_table: PathTable | None = None,
) -> QuestionScores:
    """All UAG scores of one question (see the module docstring).

    Args:
        record: the question, its topic entities, gold answers and graph.
        cache: text embeddings of the relation scorer's encoder (normalised, so a dot product is a cosine).
        max_hops: longest relation path.
        max_paths: bound on enumerated paths (deterministic order: shortest first, then relation order); when it
            is reached a warning is logged and the traversal may reach paths the scores do not hold.
        kg: the record's graph index, if already built.
        llm_answer: the reasoner LLM's answer over the question's paths; ``None`` or blank = no LLM answer.
        walks: the record's relation paths, if already enumerated.
        queries: where the step queries' embeddings come from (:func:`step_scores`).
        path_table: the table the question's :class:`PathList` refers to (shared by :func:`score_questions`).
    """
    kg = kg or KGIndex.from_record(record)
    if walks is None:
        walks = _walks(record, kg, max_hops, max_paths)
    paths = list(walks)
    entities = sorted(set().union(*walks.values())) if walks else []
    eid = {e: i for i, e in enumerate(entities)}
    q_emb = cache.embed([record.question])[0]
    # Eq. 4 scores of every hop before a path's last one
    steps = sorted({(p[:j], p[j]) for p in paths for j in range(len(p) - 1)})
    step_values = step_scores(cache, record.question, [s[0] for s in steps], [s[1] for s in steps], queries).tolist()
    step_of = dict(zip(steps, step_values))
    # the traversal's scores live on the CPU, beside the embedding cache's vectors
    expand = torch.tensor(
        [max((step_of[(p[:j], p[j])] for j in range(len(p) - 1)), default=float("-inf")) for p in paths],
        dtype=torch.float32,
        device="cpu",
    )
    pairs = [(i, eid[e]) for i, p in enumerate(paths) for e in sorted(walks[p])]
    incidence = (  # int32: the pool of a full-size split holds millions of pairs
        torch.tensor(pairs, dtype=torch.int32, device="cpu").T.contiguous()
        if pairs
        else torch.zeros(2, 0, dtype=torch.int32, device="cpu")
    )
    gold_names = set(record.a_entity)
    return QuestionScores(
        qid=record.id,
        entities=entities,
        paths=PathList(path_table if path_table is not None else PathTable(), paths),
        expand=expand,
        path_score=path_scores(cache, q_emb, paths),
        incidence=incidence.reshape(2, -1),
        evaluator=evaluator_scores(cache, entities, record.question, llm_answer),
        gold=torch.tensor([e in gold_names for e in entities], dtype=torch.bool, device="cpu"),
        n_gold=len(gold_names),
        llm_answer=llm_answer,
    )


def score_questions(
    records: Sequence[KGQARecord],
    cache: EmbeddingCache,
    *,
    max_hops: int = 3,
    max_paths: int | None = 5000,
    llm_answers: Sequence[str | None] | None = None,
    chunk_size: int = 256,
    progress: bool = True,
    desc: str = "UAG scores",
    queries: TransientEmbeddings | None = None,
) -> list[QuestionScores]:
    """:func:`score_question` for many records; the new strings of each chunk are encoded in one batch.

    What the disk cache keeps (questions, relation and path texts, entity names) goes to ``cache``; the step
    queries, one set per question, are encoded per chunk and dropped with it (:class:`TransientEmbeddings`); the
    scores share one :class:`PathTable`. So a split's pool costs about 130 bytes per path of each question,
    whatever its size, and the disk cache grows with the split's distinct names, not with its questions.

    Args:
        records: the questions.
        cache: text embeddings of the relation scorer's encoder.
        max_hops: longest relation path.
        max_paths: bound on enumerated paths per question (see :func:`score_question`).
        llm_answers: one reasoner answer per record (``None`` = no LLM).
        chunk_size: questions whose new strings are encoded in one batch.
        progress: show a progress bar.
        desc: the progress bar's label.
        queries: where the step queries are embedded, for a caller that scores the same questions again (the
            traversal of :meth:`UAGTraversal.run <kglightning.conformal.uag.traversal.UAGTraversal.run>` then
            sees the same rows); by default a fresh :class:`TransientEmbeddings` per chunk.
    """
    if llm_answers is not None and len(llm_answers) != len(records):
        raise ValueError(f"got {len(llm_answers)} LLM answers for {len(records)} records")
    answers = list(llm_answers) if llm_answers is not None else [None] * len(records)
    out: list[QuestionScores] = []
    table = PathTable()
    bar = tqdm(total=len(records), desc=desc, disable=not progress or len(records) < 2, leave=False)
    for lo in range(0, len(records), chunk_size):
        chunk = list(zip(records[lo : lo + chunk_size], answers[lo : lo + chunk_size]))
        kgs = [KGIndex.from_record(r) for r, _ in chunk]
        walks = [_walks(r, kg, max_hops, max_paths) for (r, _), kg in zip(chunk, kgs)]
        cache.add(t for (r, a), w in zip(chunk, walks) for t in _texts(r, w, a))
        scratch = queries if queries is not None else TransientEmbeddings(cache)
        scratch.add(t for (r, _), w in zip(chunk, walks) for t in _query_texts(r, w))
        for (r, a), kg, w in zip(chunk, kgs, walks):
            out.append(
                score_question(
                    r,
                    cache,
                    max_hops=max_hops,
                    max_paths=max_paths,
                    kg=kg,
                    llm_answer=a,
                    walks=w,
                    queries=scratch,
                    path_table=table,
                )  # fmt: skip
            )
            bar.update()
        del scratch, kgs, walks
    bar.close()
    return out
