"""Answer-quality Metric classes: RoG-compatible accuracy/hit/Hits@1/F1/precision/recall, strict F1 and EM.

All classes take ``update(predictions, answers)`` with one entry per question: ``predictions[i]`` is a list of
proposed answers (or RoG's newline-joined string) and ``answers[i]`` the gold list. The per-question math is
:func:`kglightning.metrics.functional.qa.answer_scores` (RoG's semantics and quirks are documented there). States are
sums with ``dist_reduce_fx="sum"``, so DDP gives the single-process numbers. ``compute()`` returns fractions (RoG's
table prints them ×100). Questions with an empty gold list are skipped and counted in the ``skipped`` state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from kglightning.metrics.functional.qa import ALL_KEYS, answer_score_sums

Predictions = Sequence[str | Sequence[str]]


class _AnswerScoreMetric(Metric):
    """Mean of one per-question score of :data:`ALL_KEYS` (set by the subclass in ``key``)."""

    key: str = ""
    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, topk: int = -1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.topk = topk
        self._index = ALL_KEYS.index(self.key)
        self.add_state("score_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("skipped", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predictions: Predictions, answers: Sequence[Sequence[str]]) -> None:
        """Add a batch of questions: one prediction (list or newline-joined string) and one gold list each."""
        sums, n, skipped = answer_score_sums(predictions, answers, self.topk)
        self.score_sum += sums[self._index].to(self.score_sum.device)
        self.count += n
        self.skipped += skipped

    def compute(self) -> Tensor:
        """The mean score over the questions seen (``nan`` before any scored question)."""
        return self.score_sum / self.count


class AnswerAccuracy(_AnswerScoreMetric):
    """RoG's accuracy: the fraction of golds found in the joined prediction string (equal to RoG's recall).

    Example:
        >>> m = AnswerAccuracy()
        >>> m.update([["Paris"], ["Rome", "Lyon"]], [["Paris", "Nice"], ["Lyon"]])
        >>> m.compute()
        tensor(0.7500, dtype=torch.float64)
    """

    key = "acc"


class AnswerHit(_AnswerScoreMetric):
    """RoG's Hit: 1 when any gold matches the joined prediction string.

    Example:
        >>> m = AnswerHit()
        >>> m.update([["Paris"], ["Rome"]], [["Paris", "Nice"], ["Lyon"]])
        >>> m.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    key = "hit"


class AnswerHits1(_AnswerScoreMetric):
    """Hits@1 as in GNN-RAG's ``eval_hit1``: the first prediction (after RoG's count ordering) matches a gold.

    Example:
        >>> m = AnswerHits1()
        >>> m.update([["Rome", "Paris"], ["Lyon", "Rome"]], [["Paris"], ["Lyon"]])
        >>> m.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    key = "hit1"


class AnswerF1(_AnswerScoreMetric):
    """RoG's macro F1 of precision (golds matched / number of predictions) and recall (golds matched / golds).

    Example:
        >>> m = AnswerF1()
        >>> m.update([["Paris", "Rome"]], [["Paris"]])
        >>> round(m.compute().item(), 4)
        0.6667
    """

    key = "f1"


class AnswerPrecision(_AnswerScoreMetric):
    """RoG's precision: golds matched in the joined prediction string / number of predictions (may exceed 1).

    Example:
        >>> m = AnswerPrecision()
        >>> m.update([["Paris Lyon"]], [["Paris", "Lyon"]])
        >>> m.compute()
        tensor(2., dtype=torch.float64)
    """

    key = "precision"


class AnswerRecall(_AnswerScoreMetric):
    """RoG's recall: golds matched in the joined prediction string / number of golds.

    Example:
        >>> m = AnswerRecall()
        >>> m.update([["Paris"]], [["Paris", "Lyon"]])
        >>> m.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    key = "recall"


class StrictAnswerF1(_AnswerScoreMetric):
    """Set-based F1 on normalized exact matches (no substring matching).

    Example:
        >>> m = StrictAnswerF1()
        >>> m.update([["Paris, Texas", "Lyon"]], [["Paris", "Lyon"]])
        >>> m.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    key = "strict_f1"


class ExactMatch(_AnswerScoreMetric):
    """Exact match: the normalized prediction set equals the normalized gold set.

    Example:
        >>> m = ExactMatch()
        >>> m.update([["the Lyon", "Paris"], ["Paris"]], [["Paris", "Lyon"], ["Paris", "Nice"]])
        >>> m.compute()
        tensor(0.5000, dtype=torch.float64)
    """

    key = "em"


class RoGAnswerMetrics(Metric):
    """All answer metrics in one pass: a dict with the keys of :data:`~kglightning.metrics.functional.qa.ALL_KEYS`.

    Keys: ``acc``, ``hit``, ``hit1``, ``f1``, ``precision``, ``recall`` (RoG) and ``strict_f1``,
    ``strict_precision``, ``strict_recall``, ``em`` (strict). Values are fractions.

    Args:
        topk: keep the ``topk`` most frequent entries of list predictions, as RoG's ``--top_k``; ``-1`` keeps all.

    Example:
        >>> m = RoGAnswerMetrics()
        >>> m.update([["Paris"], "Rome\\nLyon"], [["Paris"], ["Lyon", "Nice"]])
        >>> out = m.compute()
        >>> {k: round(out[k].item(), 4) for k in ("hit", "hit1", "f1", "em")}
        {'hit': 1.0, 'hit1': 0.5, 'f1': 0.75, 'em': 0.5}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, topk: int = -1, **kwargs) -> None:
        super().__init__(**kwargs)
        self.topk = topk
        self.add_state("sums", torch.zeros(len(ALL_KEYS), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("skipped", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, predictions: Predictions, answers: Sequence[Sequence[str]]) -> None:
        """Add a batch of questions: one prediction (list or newline-joined string) and one gold list each."""
        sums, n, skipped = answer_score_sums(predictions, answers, self.topk)
        self.sums += sums.to(self.sums.device)
        self.count += n
        self.skipped += skipped

    def compute(self) -> dict[str, Tensor]:
        """Mean of every score over the questions seen."""
        return dict(zip(ALL_KEYS, (self.sums / self.count).unbind()))
