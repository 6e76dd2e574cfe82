"""Prediction-set Metric classes: empirical coverage (UAG's ECR) and average set size (APSS).

Both accept the two set forms of :mod:`kglightning.metrics.functional.coverage` (lists of string collections, or
boolean ``(n_questions, n_candidates)`` membership tensors) and keep sum states with ``dist_reduce_fx="sum"``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

from kglightning.metrics.functional.coverage import Mode, SetsLike, _check_mode, covered, set_sizes


class EmpiricalCoverage(Metric):
    """Fraction of questions whose prediction set covers the gold answers.

    Args:
        mode: ``"any"`` (at least one gold answer in the set) or ``"all"`` (every gold answer in the set).
        normalized: compare RoG-normalized strings (string sets only).

    Example:
        >>> m = EmpiricalCoverage()
        >>> m.update([{"Paris", "Lyon"}], [["Paris"]])
        >>> m.update(torch.tensor([[True, False], [False, True]]), torch.tensor([[False, True], [False, True]]))
        >>> round(m.compute().item(), 4)
        0.6667
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, mode: Mode = "any", normalized: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        _check_mode(mode)
        self.mode, self.normalized = mode, normalized
        self.add_state("covered_sum", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred_sets: SetsLike, gold_sets: SetsLike) -> None:
        """Add a batch of prediction sets and their gold answers."""
        cov = covered(pred_sets, gold_sets, self.mode, self.normalized)
        self.covered_sum += cov.sum().to(self.covered_sum.device)
        self.count += cov.numel()

    def compute(self) -> Tensor:
        """The coverage over the questions seen (``nan`` when none)."""
        return self.covered_sum / self.count


class AverageSetSize(Metric):
    """Average number of distinct members per prediction set.

    Example:
        >>> m = AverageSetSize()
        >>> m.update([{"Paris", "Lyon"}, {"Rome"}])
        >>> m.update(torch.tensor([[True, True, True]]))
        >>> m.compute()
        tensor(2.)
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("size_sum", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, pred_sets: SetsLike) -> None:
        """Add a batch of prediction sets."""
        sizes = set_sizes(pred_sets)
        self.size_sum += sizes.sum().to(self.size_sum.device)
        self.count += sizes.numel()

    def compute(self) -> Tensor:
        """The mean set size over the questions seen (``nan`` when none)."""
        return self.size_sum / self.count
