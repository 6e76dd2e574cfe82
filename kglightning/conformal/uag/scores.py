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

import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, overload

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from kglightning.data.embeddings import EmbeddingCache, TransientEmbeddings
from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.data.store.mapped_pages import trim_heap
from kglightning.data.text import path_text, relation_text, step_query_text
from kglightning.data.triple_array import release_graphs

Coverage = Literal["any", "all"]

log = logging.getLogger(__name__)


Path = tuple[str, ...]


class PathTable:
    """The relation labels (``r`` and ``~r``) of the questions scored together, each stored once: a question's paths
    are rows of label ids (:class:`PathList`), 2 or 4 bytes per hop, where a tuple of strings costs about 70 bytes
    a path and a table of distinct paths more (paths rarely repeat from question to question)."""

    def __init__(self) -> None:
        self.labels: list[str] = []
        self._ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.labels)

    def rows(self, paths: Sequence[Path]) -> np.ndarray:
        """``(len(paths), longest)`` label ids, ``-1`` past a path's end; ``int16`` while the labels fit."""
        width = max((len(p) for p in paths), default=0)
        for label in dict.fromkeys(label for path in paths for label in path):  # new labels, in order of appearance
            if label not in self._ids:
                self._ids[label] = len(self.labels)
                self.labels.append(label)
        ids, pad = self._ids, (-1,) * width
        out = np.array([(*(ids[x] for x in path), *pad[len(path) :]) for path in paths], dtype=np.int64)
        return out.reshape(len(paths), width).astype(np.int16 if len(self.labels) < 2**15 else np.int32)


class PathList(Sequence[Path]):
    """A question's relation paths as rows of label ids over a :class:`PathTable`: reads as a list of tuples
    (``len``, indexing, iteration, ``==`` with a list).

    Example:
        >>> table = PathTable()
        >>> paths = PathList(table, [("r",), ("r", "~s")])
        >>> paths[1], len(paths), paths == [("r",), ("r", "~s")], paths.rows.tolist(), table.labels
        (('r', '~s'), 2, True, [[0, -1], [0, 1]], ['r', '~s'])
    """

    __slots__ = ("rows", "table")

    def __init__(self, table: PathTable, paths: Sequence[Path]) -> None:
        self.table = table
        self.rows = table.rows(paths)

    def __len__(self) -> int:
        return len(self.rows)

    def _path(self, row: list[int]) -> Path:
        return tuple(self.table.labels[k] for k in row if k >= 0)

    @overload
    def __getitem__(self, i: int) -> Path: ...
    @overload
    def __getitem__(self, i: slice) -> list[Path]: ...
    def __getitem__(self, i: int | slice) -> Path | list[Path]:
        if isinstance(i, slice):
            return [self._path(r) for r in self.rows[i].tolist()]
        return self._path(self.rows[i].tolist())

    def __iter__(self) -> Iterator[Path]:
        return (self._path(r) for r in self.rows.tolist())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]  # compared by value

    def __repr__(self) -> str:
        return f"PathList({list(self)!r})"


@dataclass
class QuestionScores:
    """Every score UAG needs for one question (see the module docstring).

    Attributes:
        qid: record id.
        entities: the candidate pool: every entity reached by a path (topic entities excluded), sorted.
        paths: the relation paths, shortest first (``~r`` = reverse hop); a list of tuples, or from
            :func:`score_question` a :class:`PathList` (label ids over a :class:`PathTable`).
        expand: ``(P,)`` Eq. 4 score needed to reach the start of each path's last hop.
        path_score: ``(P,)`` Eq. 5 score of each path.
        incidence: ``(2, nnz)`` integer: ``[path index, entity index]`` for each end entity of each path
            (:func:`score_question` stores ``int16`` where both counts fit, else ``int32``; use it as ``.long()``).
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
            p_idx, e_idx = self.incidence.long()
            out = out.scatter_reduce(0, e_idx, values[p_idx], reduce="amin")
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
    scratch: TransientEmbeddings | EmbeddingCache | None = None,
) -> Tensor:
    """Eq. 4 scores ``1 - cos(Q || prefix_i, relation_i)`` for aligned lists of prefixes and next relations.

    The ``Q || prefix`` texts hold the question, so no other question asks for them: they are embedded through
    ``scratch`` (not stored in the disk cache; a fresh :class:`TransientEmbeddings` when ``None``)."""
    if not prefixes:
        return torch.zeros(0, device="cpu")
    left = (scratch if scratch is not None else TransientEmbeddings(cache)).embed(
        [step_query_text(question, p) for p in prefixes]
    )
    return cosine_distance(left, cache.embed([relation_text(r) for r in relations]))


def path_scores(
    cache: EmbeddingCache,
    q_emb: Tensor,
    paths: Sequence[tuple[str, ...]],
    scratch: TransientEmbeddings | EmbeddingCache | None = None,
) -> Tensor:
    """Eq. 5 scores ``1 - cos(Q, path)`` of relation paths. A question's thousands of paths seldom recur in another
    question, so their texts go through ``scratch`` too (not stored; a fresh one when ``None``)."""
    if not paths:
        return torch.zeros(0, device="cpu")
    own = scratch if scratch is not None else TransientEmbeddings(cache)
    return cosine_distance(own.embed([path_text(p) for p in paths]), q_emb)


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
    """The strings :func:`score_question` embeds for ``record`` that the disk cache keeps (the others are
    :func:`_scratch_texts`)."""
    texts = [record.question, *(llm_answer.strip() for _ in [0] if llm_answer and llm_answer.strip())]
    texts += [relation_text(p[j]) for p in walks for j in range(len(p) - 1)]
    texts += sorted(set().union(*walks.values())) if walks else []
    return texts


def _scratch_texts(record: KGQARecord, walks: dict[tuple[str, ...], set[str]]) -> set[str]:
    """The texts of ``record`` no other question needs: its Eq. 4 step queries ``Q || r_0 || ... || r_{j-1}`` and its
    paths' texts."""
    out = {step_query_text(record.question, p[:j]) for p in walks for j in range(len(p) - 1)}
    return out.union(path_text(p) for p in walks)


def score_question(
    record: KGQARecord,
    cache: EmbeddingCache,
    *,
    max_hops: int = 3,
    max_paths: int | None = 5000,
    kg: KGIndex | None = None,
    llm_answer: str | None = None,
    walks: dict[tuple[str, ...], set[str]] | None = None,
    scratch: TransientEmbeddings | EmbeddingCache | None = None,
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
        scratch: where the step queries' and paths' embeddings come from (:func:`step_scores`).
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
    step_values = step_scores(cache, record.question, [s[0] for s in steps], [s[1] for s in steps], scratch).tolist()
    step_of = dict(zip(steps, step_values))
    # the traversal's scores live on the CPU, beside the embedding cache's vectors
    expand = torch.tensor(
        [max((step_of[(p[:j], p[j])] for j in range(len(p) - 1)), default=float("-inf")) for p in paths],
        dtype=torch.float32,
        device="cpu",
    )
    pairs = [(i, eid[e]) for i, p in enumerate(paths) for e in sorted(walks[p])]
    small = max(len(paths), len(entities)) < 2**15  # the pool of a full-size split holds millions of pairs
    index_type = torch.int16 if small else torch.int32
    incidence = (
        torch.tensor(pairs, dtype=index_type, device="cpu").T.contiguous()
        if pairs
        else torch.zeros(2, 0, dtype=index_type, device="cpu")
    )
    gold_names = set(record.a_entity)
    return QuestionScores(
        qid=record.id,
        entities=entities,
        paths=PathList(path_table if path_table is not None else PathTable(), paths),
        expand=expand,
        path_score=path_scores(cache, q_emb, paths, scratch),
        incidence=incidence.reshape(2, -1),
        evaluator=evaluator_scores(cache, entities, record.question, llm_answer),
        gold=torch.tensor([e in gold_names for e in entities], dtype=torch.bool, device="cpu"),
        n_gold=len(gold_names),
        llm_answer=llm_answer,
    )


def release_pages(record: KGQARecord, cache: EmbeddingCache) -> None:
    """Once a question is scored, drop from this process the pages of memory-mapped files it read: its graph's, when
    the records come from the record store, and the embedding table's (:mod:`~kglightning.data.store.mapped_pages`). They
    stay in the page cache; without this a pass over a full-size split ends with the whole of both files in its RSS
    (3.3 GB on CWQ's training split), though no question needs them again. A few milliseconds a question."""
    release_graphs([record.graph])
    cache.release_pages()


def score_questions(
    records: Sequence[KGQARecord],
    cache: EmbeddingCache,
    *,
    max_hops: int = 3,
    max_paths: int | None = 5000,
    llm_answers: Sequence[str | None] | None = None,
    chunk_size: int = 32,
    progress: bool = True,
    desc: str = "UAG scores",
    store_question_texts: bool = False,
    scratches: Sequence[TransientEmbeddings] | None = None,
) -> list[QuestionScores]:
    """:func:`score_question` for many records; the new strings of each chunk are encoded in one batch.

    What the disk cache keeps (questions, relation texts, entity names) goes to ``cache``, a chunk's new strings in one
    batch. The texts no other question needs (its step queries and path texts, thousands per question at RoG size)
    are encoded per question, in one batch of that question's texts alone, so its rows do not depend on which
    questions share its chunk, batch or process, and are dropped once it is scored (:class:`TransientEmbeddings`).
    A question's paths are label ids (:class:`PathList`) over one :class:`PathTable`. So the pool costs about 120
    bytes per path of each question, and the disk cache grows with the split's distinct names, not its questions.

    Args:
        records: the questions.
        cache: text embeddings of the relation scorer's encoder.
        max_hops: longest relation path.
        max_paths: bound on enumerated paths per question (see :func:`score_question`).
        llm_answers: one reasoner answer per record (``None`` = no LLM).
        chunk_size: questions whose new shared strings are encoded in one batch (their graphs and paths are held
            together meanwhile: 32 WebQSP-size questions peak at 1.2 GB in all, 256 at 1.9 GB).
        progress: show a progress bar.
        desc: the progress bar's label.
        store_question_texts: keep the step queries and path texts in the disk cache too, as the shared texts are
            (reruns on the same questions then encode nothing; the cache grows by thousands of rows a question).
        scratches: one :class:`TransientEmbeddings` per record, kept by a caller that walks the same questions
            again (the traversal of :meth:`UAGTraversal.run
            <kglightning.conformal.uag.traversal.UAGTraversal.run>` then reads the same rows).
    """
    if llm_answers is not None and len(llm_answers) != len(records):
        raise ValueError(f"got {len(llm_answers)} LLM answers for {len(records)} records")
    if scratches is not None and len(scratches) != len(records):
        raise ValueError(f"got {len(scratches)} scratches for {len(records)} records")
    answers = list(llm_answers) if llm_answers is not None else [None] * len(records)
    out: list[QuestionScores] = []
    score = functools.partial(
        score_question, cache=cache, max_hops=max_hops, max_paths=max_paths, path_table=PathTable()
    )
    bar = tqdm(total=len(records), desc=desc, disable=not progress or len(records) < 2, leave=False)
    for lo in range(0, len(records), chunk_size):
        chunk = list(zip(records[lo : lo + chunk_size], answers[lo : lo + chunk_size]))
        kgs = [KGIndex.from_record(r) for r, _ in chunk]
        walks = [_walks(r, kg, max_hops, max_paths) for (r, _), kg in zip(chunk, kgs)]
        cache.add(t for (r, a), w in zip(chunk, walks) for t in _texts(r, w, a))
        for i, ((r, a), kg, w) in enumerate(zip(chunk, kgs, walks)):
            own: TransientEmbeddings | EmbeddingCache
            if store_question_texts:
                own = cache
            else:
                own = scratches[lo + i] if scratches is not None else TransientEmbeddings(cache)
            own.add(_scratch_texts(r, w))  # this question's texts alone in one batch
            out.append(score(r, kg=kg, llm_answer=a, walks=w, scratch=own))
            release_pages(r, cache)
            bar.update()
        del kgs, walks
        trim_heap()  # the chunk's freed temporaries back to the system, not kept by the heap
    bar.close()
    return out
