"""What a selection of answers achieved: the hallucinated share of the kept ones, the right ones kept, abstentions."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def selection_metrics(keep: Tensor, hallucinated: Tensor, question: Tensor) -> dict[str, float | int]:
    """Achieved rates of a selection of answers, against their true labels.

    Args:
        keep: ``(N,)`` booleans, ``True`` = the answer is kept.
        hallucinated: ``(N,)`` booleans, ``True`` = the answer is hallucinated.
        question: ``(N,)`` integer question ids.

    Returns:
        ``answers``, ``kept``, ``fdr`` (hallucinated share of the kept answers, 0 when none is kept: the FDP),
        ``power`` (share of the right answers that are kept; NaN when there is none), ``kept_share``, ``questions``
        (with at least one answer), ``abstention`` (share of those that keep none), ``question_error`` (share that
        keep a hallucinated answer), ``weighted_fdr`` (the hallucinated share of the kept answers when each
        question weighs one, spread over its answers: what ``kept_rate`` bounds; 0 when none is kept) and ``base_rate`` (hallucinated share of every answer: the FDR of keeping all).

    Example:
        >>> m = selection_metrics(torch.tensor([True, True, False, False]), torch.tensor([False, True, False, True]),
        ...                       torch.tensor([0, 0, 1, 1]))
        >>> m["fdr"], m["power"], m["abstention"], m["question_error"]
        (0.5, 0.5, 0.5, 0.5)
    """
    keep, bad = keep.bool().flatten().cpu(), hallucinated.bool().flatten().cpu()
    q = question.flatten().cpu()
    if not keep.numel() == bad.numel() == q.numel():
        raise ValueError(
            f"keep, hallucinated and question differ in length: {keep.numel()}, {bad.numel()}, {q.numel()}"
        )
    n, k = keep.numel(), int(keep.sum())
    good = int((~bad).sum())
    ids, unit = torch.unique(q, return_inverse=True)
    nq = ids.numel()
    size = torch.zeros(nq, dtype=torch.long, device="cpu").scatter_add_(
        0, unit, torch.ones_like(keep, dtype=torch.long)
    )
    n_kept = torch.zeros(nq, dtype=torch.long, device="cpu").scatter_add_(0, unit, keep.long())
    n_kept_bad = torch.zeros(nq, dtype=torch.long, device="cpu").scatter_add_(0, unit, (keep & bad).long())
    kept_any, kept_bad = n_kept > 0, n_kept_bad > 0
    return {
        "answers": n,
        "kept": k,
        "fdr": float((keep & bad).sum()) / k if k else 0.0,
        "power": float((keep & ~bad).sum()) / good if good else float("nan"),
        "kept_share": k / n if n else float("nan"),
        "questions": nq,
        "abstention": float((~kept_any).sum()) / nq if nq else float("nan"),
        "question_error": float(kept_bad.sum()) / nq if nq else float("nan"),
        "weighted_fdr": _weighted_fdr(n_kept, n_kept_bad, size),
        "base_rate": float(bad.sum()) / n if n else float("nan"),
    }


def _weighted_fdr(n_kept: Tensor, n_bad: Tensor, size: Tensor) -> float:
    kept = (n_kept.double() / size.double().clamp(min=1)).sum()
    return float((n_bad.double() / size.double().clamp(min=1)).sum() / kept) if kept > 0 else 0.0


def grouped_selection_metrics(
    keep: Tensor, hallucinated: Tensor, question: Tensor, group: Sequence[str] | None = None
) -> dict[str, dict[str, float | int]]:
    """:func:`selection_metrics` over every answer (key ``"all"``) and within each group (its name).

    Example:
        >>> m = grouped_selection_metrics(torch.tensor([True, True]), torch.tensor([False, True]), torch.tensor([0, 1]),
        ...                               ["grounded", "ungrounded"])
        >>> m["all"]["fdr"], m["ungrounded"]["fdr"]
        (0.5, 1.0)
    """
    out = {"all": selection_metrics(keep, hallucinated, question)}
    if group is not None:
        if len(group) != keep.numel():
            raise ValueError(f"group has {len(group)} entries for {keep.numel()} answers")
        for g in sorted(set(group)):
            m = torch.tensor([x == g for x in group], dtype=torch.bool, device="cpu")
            out[str(g)] = selection_metrics(keep[m], hallucinated[m], question[m])
    return out
