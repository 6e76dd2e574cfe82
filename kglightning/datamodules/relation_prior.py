"""A nearest-neighbour prior over training questions: do the relation paths that reach an answer answer questions
like this one?

A KG answer is right when the relations that lead to it from the question's topic entity are the ones the question
asks about. Which relations those are is learned cheaply from the training split: for a question, take the ``k``
training questions most similar to it (cosine of their text embeddings), and for an answer, the shortest relation
paths from a topic entity to it. The prior is the similarity-weighted share of those neighbours whose gold answers
are reached by one of the same relation paths. An answer reached the way similar questions were answered scores
near 1; one reached by relations that never answered a similar question scores near 0.

A training question is never its own neighbour, so the feature reads on the training split as it will on the
others.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["RelationPrior"]


class RelationPrior:
    """The prior of :mod:`this module <kglightning.datamodules.relation_prior>`, fitted on a training split.

    Args:
        neighbours: how many training questions vote.

    Example:
        >>> q = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])  # two capital questions, one language question
        >>> prior = RelationPrior(neighbours=2).fit(q, [{"capital"}, {"capital"}, {"language"}], ["a", "b", "c"])
        >>> prior.score(torch.tensor([[1.0, 0.05]]), [[{"capital"}, {"borders"}, set()]], ["new"])
        [[1.0, 0.0, 0.0]]
        >>> prior.score(q[:1], [[{"capital"}]], ["a"])  # "a" itself does not vote: "b" does, and "c" (cosine 0)
        [[1.0]]
    """

    def __init__(self, neighbours: int = 10) -> None:
        if neighbours < 1:
            raise ValueError(f"neighbours must be >= 1, got {neighbours}")
        self.neighbours = neighbours
        self.questions: Tensor | None = None
        self.gold: list[frozenset[str]] = []
        self.ids: dict[str, int] = {}

    def fit(self, questions: Tensor, gold_paths: Sequence[set[str]], ids: Sequence[str]) -> RelationPrior:
        """``questions``: ``(N, d)`` L2-normalised embeddings of the training questions; ``gold_paths``: per question,
        the relation paths (any hashable text) that reach one of its gold answers; ``ids``: the questions' ids."""
        if not (len(questions) == len(gold_paths) == len(ids)):
            raise ValueError(f"{len(questions)} questions, {len(gold_paths)} path sets and {len(ids)} ids")
        self.questions = questions.detach().float().cpu()
        self.gold = [frozenset(p) for p in gold_paths]
        self.ids = {qid: i for i, qid in enumerate(ids)}
        return self

    def score(
        self, questions: Tensor, answer_paths: Sequence[Sequence[set[str]]], ids: Sequence[str], chunk: int = 1024
    ) -> list[list[float]]:
        """Per question, per answer: the prior (0 for an answer with no path, or when no neighbour is similar).

        ``questions``: ``(M, d)`` normalised embeddings; ``answer_paths``: per question, per answer, its relation
        paths; ``ids``: the questions' ids (a training question is left out of its own neighbours)."""
        if self.questions is None:
            raise RuntimeError("RelationPrior.score before fit")
        bank = self.questions
        k = min(self.neighbours, max(len(bank) - 1, 1))
        out: list[list[float]] = []
        for start in range(0, len(questions), chunk):
            sims = questions[start : start + chunk].detach().float().cpu() @ bank.T
            for row, qid in enumerate(ids[start : start + chunk]):
                own = self.ids.get(qid)
                if own is not None:
                    sims[row, own] = float("-inf")
            top = torch.topk(sims, min(k, bank.shape[0]), dim=1)
            weights = top.values.clamp_min(0).tolist()
            for row, (w, idx) in enumerate(zip(weights, top.indices.tolist())):
                total = sum(w)
                values = []
                for paths in answer_paths[start + row]:
                    if not paths or total <= 0:
                        values.append(0.0)
                        continue
                    hit = sum(wj for wj, j in zip(w, idx) if not self.gold[j].isdisjoint(paths))
                    values.append(hit / total)
                out.append(values)
        return out
