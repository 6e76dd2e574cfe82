"""Calibration Metric classes with O(bins) memory: ECE, MCE and the Brier score.

Unlike torchmetrics' ``BinaryCalibrationError``, which keeps every prediction in list states, these keep per-bin sums
(:func:`~kglightning.metrics.functional.calibration.calibration_bin_sums`) reduced with ``dist_reduce_fx="sum"``.
The binning is torchmetrics' (see :mod:`kglightning.metrics.functional.calibration`), so the numbers are the same.
``update(conf, correct)`` takes per-answer confidences in ``[0, 1]`` and whether each answer is right.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from kglightning.metrics.functional.calibration import (
    Norm,
    _as_inputs,
    calibration_bin_sums,
    calibration_error_from_bin_sums,
)


class _BinnedCalibrationError(Metric):
    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, n_bins: int = 10, norm: Norm = "l1", **kwargs) -> None:
        super().__init__(**kwargs)
        if not isinstance(n_bins, int) or n_bins < 1:
            raise ValueError(f"n_bins must be a positive int, got {n_bins!r}")
        if norm not in ("l1", "l2", "max"):
            raise ValueError(f"norm must be 'l1', 'l2' or 'max', got {norm!r}")
        self.n_bins, self.norm = n_bins, norm
        for name in ("conf_sum", "correct_sum", "bin_count"):
            self.add_state(name, torch.zeros(n_bins + 1, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, conf: Tensor | Sequence[float], correct: Tensor | Sequence[bool]) -> None:
        """Add per-answer confidences ``(N,)`` and correctness ``(N,)``."""
        conf_sum, correct_sum, count = calibration_bin_sums(conf, correct, self.n_bins)
        self.conf_sum += conf_sum.to(self.conf_sum.device)
        self.correct_sum += correct_sum.to(self.correct_sum.device)
        self.bin_count += count.to(self.bin_count.device)

    def compute(self) -> Tensor:
        """The calibration error over everything seen (``nan`` when empty)."""
        return calibration_error_from_bin_sums(self.conf_sum, self.correct_sum, self.bin_count, self.norm)


class ExpectedCalibrationError(_BinnedCalibrationError):
    """Expected calibration error (``norm="l1"``; ``"l2"`` and ``"max"`` are accepted too).

    Args:
        n_bins: number of equal-width bins over ``[0, 1]``.
        norm: ``"l1"`` (ECE), ``"l2"`` (RMS calibration error) or ``"max"`` (MCE).

    Example:
        >>> m = ExpectedCalibrationError(n_bins=2)
        >>> m.update(torch.tensor([0.25, 0.25, 0.55]), torch.tensor([0, 0, 1]))
        >>> m.update(torch.tensor([0.75, 0.75]), torch.tensor([1, 1]))
        >>> round(m.compute().item(), 4)
        0.29
    """

    def __init__(self, n_bins: int = 10, norm: Norm = "l1", **kwargs) -> None:
        super().__init__(n_bins=n_bins, norm=norm, **kwargs)


class MaximumCalibrationError(_BinnedCalibrationError):
    """Maximum calibration error: the largest gap between accuracy and confidence over the bins.

    Example:
        >>> m = MaximumCalibrationError(n_bins=2)
        >>> m.update(torch.tensor([0.25, 0.25, 0.55, 0.75, 0.75]), torch.tensor([0, 0, 1, 1, 1]))
        >>> round(m.compute().item(), 4)
        0.3167
    """

    def __init__(self, n_bins: int = 10, **kwargs) -> None:
        super().__init__(n_bins=n_bins, norm="max", **kwargs)


class BrierScore(Metric):
    """Brier score ``mean((conf - correct) ** 2)`` over all answers seen.

    Example:
        >>> m = BrierScore()
        >>> m.update(torch.tensor([1.0, 0.5]), torch.tensor([True, False]))
        >>> m.update(torch.tensor([0.0]), torch.tensor([False]))
        >>> round(m.compute().item(), 4)
        0.0833
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("sq_sum", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, conf: Tensor | Sequence[float], correct: Tensor | Sequence[bool]) -> None:
        """Add per-answer confidences ``(N,)`` and correctness ``(N,)``."""
        conf_t, correct_t = _as_inputs(conf, correct)
        err = (conf_t.to(torch.float64) - correct_t.to(torch.float64)) ** 2
        self.sq_sum += err.sum().to(self.sq_sum.device)
        self.count += err.numel()

    def compute(self) -> Tensor:
        """The mean squared error (``nan`` when empty)."""
        return self.sq_sum / self.count
