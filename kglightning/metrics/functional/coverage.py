"""Coverage and size of prediction sets (UAG's ECR and APSS; conformal prediction).

Sets come in one of two forms:

* lists of string collections, one per question (``[{"Paris", "Lyon"}, ...]``); strings are compared as given, or
  after :func:`~kglightning.metrics.functional.qa.normalize` with ``normalized=True``;
* boolean membership tensors of shape ``(n_questions, n_candidates)``: ``pred[i, j]`` says candidate ``j`` is in the
  set of question ``i``, and the gold mask has the same shape.

A question is covered (``mode="any"``) when its set holds at least one gold answer, or (``mode="all"``) every gold
answer. With no gold answer at all, ``"any"`` is never covered and ``"all"`` is vacuously covered; drop such questions
beforehand if that is not what you want. Means over zero questions are ``nan``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Literal

import torch
from torch import Tensor

from kglightning.metrics.functional.qa import normalize

Mode = Literal["any", "all"]
SetsLike = Tensor | Sequence[Collection[str]]


def _check_mode(mode: str) -> None:
    if mode not in ("any", "all"):
        raise ValueError(f"mode must be 'any' or 'all', got {mode!r}")


def covered(pred_sets: SetsLike, gold_sets: SetsLike, mode: Mode = "any", normalized: bool = False) -> Tensor:
    """Per question, whether its prediction set covers the gold answers; a bool tensor of shape ``(n_questions,)``.

    Args:
        pred_sets: prediction sets, a list of string collections or a bool tensor ``(n_questions, n_candidates)``.
        gold_sets: gold answers, in the same form as ``pred_sets``.
        mode: ``"any"``: at least one gold answer is in the set; ``"all"``: every gold answer is.
        normalized: for string sets, compare RoG-normalized strings.

    Example:
        >>> covered([{"Paris", "Lyon"}, {"Rome"}], [["Paris", "Nice"], ["Oslo"]])
        tensor([ True, False])
        >>> covered(torch.tensor([[1, 1, 0]]).bool(), torch.tensor([[1, 0, 1]]).bool(), mode="all")
        tensor([False])
    """
    _check_mode(mode)
    if isinstance(pred_sets, Tensor):
        if not isinstance(gold_sets, Tensor) or gold_sets.shape != pred_sets.shape or pred_sets.dim() != 2:
            raise ValueError("tensor sets need a gold mask of the same (n_questions, n_candidates) shape")
        pred, gold = pred_sets.bool(), gold_sets.bool()
        return (pred & gold).any(1) if mode == "any" else (pred | ~gold).all(1)
    if len(pred_sets) != len(gold_sets):
        raise ValueError(f"got {len(pred_sets)} prediction sets for {len(gold_sets)} gold sets")
    out = []
    for pred, gold in zip(pred_sets, gold_sets):
        if isinstance(pred, str) or isinstance(gold, str):
            raise TypeError("each set must be a collection of strings, not a bare string")
        p = {normalize(x) for x in pred} if normalized else set(pred)
        g = {normalize(x) for x in gold} if normalized else set(gold)
        out.append(bool(p & g) if mode == "any" else g <= p)
    return torch.tensor(out, dtype=torch.bool, device="cpu")  # from Python sets: the Metric moves it


def set_sizes(pred_sets: SetsLike) -> Tensor:
    """Size of each prediction set (distinct members), a long tensor of shape ``(n_questions,)``.

    Example:
        >>> set_sizes([{"a", "b"}, ["c", "c"], []])
        tensor([2, 1, 0])
    """
    if isinstance(pred_sets, Tensor):
        return pred_sets.bool().sum(1)
    return torch.tensor([len(set(p)) for p in pred_sets], dtype=torch.long, device="cpu")


def set_coverage(pred_sets: SetsLike, gold_sets: SetsLike, mode: Mode = "any", normalized: bool = False) -> Tensor:
    """Empirical coverage: the fraction of questions whose set covers the gold answers (see :func:`covered`).

    Example:
        >>> set_coverage([{"Paris", "Lyon"}, {"Rome"}], [["Paris", "Nice"], ["Oslo"]])
        tensor(0.5000)
        >>> set_coverage([{"Paris", "Lyon"}, {"Rome"}], [["Paris", "Nice"], ["Oslo"]], mode="all")
        tensor(0.)
    """
    cov = covered(pred_sets, gold_sets, mode, normalized)
    return cov.float().mean() if cov.numel() else torch.tensor(float("nan"), device=cov.device)


def average_set_size(pred_sets: SetsLike) -> Tensor:
    """Average prediction-set size (APSS).

    Example:
        >>> average_set_size([{"a", "b"}, {"c"}, set()])
        tensor(1.)
        >>> average_set_size(torch.tensor([[True, True, False], [False, False, True]]))
        tensor(1.5000)
    """
    sizes = set_sizes(pred_sets)
    return sizes.float().mean() if sizes.numel() else torch.tensor(float("nan"), device=sizes.device)
