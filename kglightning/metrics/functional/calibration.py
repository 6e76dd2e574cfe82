"""Calibration of per-answer confidences: ECE, MCE, Brier score and reliability bins.

Inputs are ``conf`` (one confidence in ``[0, 1]`` per proposed answer) and ``correct`` (whether that answer is right,
see :func:`kglightning.metrics.functional.qa.answer_correctness`).

Binning follows torchmetrics' ``binary_calibration_error``: bin ``k`` holds ``k / n_bins <= conf < (k + 1) / n_bins``,
closed on the left and open on the right, so a confidence of exactly ``1.0`` falls in an extra bin ``n_bins`` of its
own (frequent with verbalized "100%" confidences). The bin-sum helpers below keep that layout (``n_bins + 1`` slots),
so the DDP-safe Metric classes, which only store those sums, reproduce torchmetrics' numbers while using O(bins)
memory. One difference: the comparison is always made in float32 against the boundaries ``k / n_bins`` rounded to
float32, so a confidence of 0.7 lands in the same bin whether it arrives as float32 or float64 (torchmetrics compares
in the input's dtype, where float32 0.7 and float64 0.7 sit on either side of their boundary). Confidences outside ``[0, 1]`` are rejected (torchmetrics would
silently apply a sigmoid to them). Empty input gives ``nan``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

Norm = Literal["l1", "l2", "max"]


def _as_inputs(
    conf: Tensor | Sequence[float], correct: Tensor | Sequence[bool] | Sequence[float], soft: bool = False
) -> tuple[Tensor, Tensor]:
    conf_t = conf if isinstance(conf, Tensor) else torch.as_tensor(conf, device="cpu")  # a tensor keeps its device
    if not conf_t.is_floating_point():
        conf_t = conf_t.to(torch.get_default_dtype())
    correct_t = correct if isinstance(correct, Tensor) else torch.as_tensor(correct, device=conf_t.device)
    conf_t, correct_t = conf_t.reshape(-1), correct_t.reshape(-1)
    if conf_t.shape != correct_t.shape:
        raise ValueError(f"conf has {conf_t.numel()} values but correct has {correct_t.numel()}")
    if conf_t.numel() and not bool(((conf_t >= 0) & (conf_t <= 1)).all()):
        raise ValueError("confidences must lie in [0, 1]")
    if soft:
        correct_t = correct_t.to(torch.float64)
        if correct_t.numel() and not bool(((correct_t >= 0) & (correct_t <= 1)).all()):
            raise ValueError("targets must lie in [0, 1]")
    elif correct_t.dtype != torch.bool:
        if correct_t.numel() and not bool(((correct_t == 0) | (correct_t == 1)).all()):
            raise ValueError("correct must be boolean or 0/1")
        correct_t = correct_t.bool()
    return conf_t, correct_t


def bin_index(conf: Tensor, n_bins: int) -> Tensor:
    """The bin of each confidence: ``k`` for ``k / n_bins <= conf < (k + 1) / n_bins``, ``n_bins`` for ``1.0``.

    Compared in float32 against ``k / n_bins`` rounded to float32, whatever the input's dtype; a float64 just
    below 1 that rounds to 1.0 in float32 stays in the last bin of width ``1 / n_bins``.

    Example:
        >>> bin_index(torch.tensor([0.7, 0.9], dtype=torch.float64), 10).tolist()
        [7, 9]
        >>> bin_index(torch.tensor([0.7, 0.9], dtype=torch.float32), 10).tolist()
        [7, 9]
    """
    boundaries = (torch.arange(n_bins + 1, dtype=torch.float64, device=conf.device) / n_bins).float()
    idx = torch.bucketize(conf.float(), boundaries, right=True) - 1
    return torch.where(conf < 1, idx.clamp(max=n_bins - 1), idx)  # the last slot holds exactly 1.0 only


def calibration_bin_sums(
    conf: Tensor | Sequence[float],
    correct: Tensor | Sequence[bool] | Sequence[float],
    n_bins: int = 10,
    soft: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-bin sums ``(conf_sum, correct_sum, count)``, float64 tensors of shape ``(n_bins + 1,)``.

    Bin ``k < n_bins`` holds ``k / n_bins <= conf < (k + 1) / n_bins``; bin ``n_bins`` holds ``conf == 1.0``.
    With ``soft=True``, ``correct`` holds targets in ``[0, 1]`` (e.g. a Bayesian confidence) instead of 0/1.

    Example:
        >>> s, c, n = calibration_bin_sums([0.05, 0.95, 1.0], [False, True, True], n_bins=2)
        >>> n.tolist(), c.tolist()
        ([1.0, 1.0, 1.0], [0.0, 1.0, 1.0])
    """
    conf_t, correct_t = _as_inputs(conf, correct, soft)
    idx = bin_index(conf_t, n_bins)
    zeros = torch.zeros(n_bins + 1, dtype=torch.float64, device=conf_t.device)
    conf_sum = zeros.scatter_add(0, idx, conf_t.to(torch.float64))
    correct_sum = zeros.scatter_add(0, idx, correct_t.to(torch.float64))
    count = zeros.scatter_add(0, idx, torch.ones_like(conf_t, dtype=torch.float64))
    return conf_sum, correct_sum, count


def calibration_error_from_bin_sums(conf_sum: Tensor, correct_sum: Tensor, count: Tensor, norm: Norm = "l1") -> Tensor:
    """Calibration error from per-bin sums, with torchmetrics' formulas (``l1`` = ECE, ``max`` = MCE, ``l2`` = RMS).

    Empty bins count as confidence 0 and accuracy 0, as in torchmetrics, so they never raise the ``max``.

    Example:
        >>> calibration_error_from_bin_sums(*calibration_bin_sums([0.25, 0.25, 0.75], [0, 1, 1], n_bins=2))
        tensor(0.2500, dtype=torch.float64)
    """
    total = count.sum()
    if total == 0:
        return torch.tensor(float("nan"), dtype=torch.float64, device=count.device)
    safe = count.clamp(min=1)
    gap = (correct_sum / safe - conf_sum / safe).abs()
    if norm == "l1":
        return (gap * count / total).sum()
    if norm == "max":
        return gap.max()
    if norm == "l2":
        return ((gap**2) * count / total).sum().sqrt()
    raise ValueError(f"norm must be 'l1', 'l2' or 'max', got {norm!r}")


def target_calibration_error(
    conf: Tensor | Sequence[float], target: Tensor | Sequence[float], n_bins: int = 10, norm: Norm = "l1"
) -> Tensor:
    """ECE against soft targets: ``sum_b (n_b / n) |mean conf_b - mean target_b|`` over equal-width bins of ``conf``.

    With 0/1 targets it is :func:`expected_calibration_error`. DoublyCal's proxy is scored this way: its stated
    confidence against the Bayesian confidence of the evidence it wrote (§4.2), since the SFT target is that number.

    Example:
        >>> target_calibration_error([0.75, 0.75, 0.2], [0.5, 1.0, 0.3], n_bins=2)
        tensor(0.0333, dtype=torch.float64)
    """
    return calibration_error_from_bin_sums(*calibration_bin_sums(conf, target, n_bins, soft=True), norm=norm)


def expected_calibration_error(
    conf: Tensor | Sequence[float], correct: Tensor | Sequence[bool], n_bins: int = 10, norm: Norm = "l1"
) -> Tensor:
    """Expected calibration error with equal-width bins: torchmetrics' ``binary_calibration_error`` formulas, with the
    dtype-independent bins of :func:`bin_index`; the result has the dtype of ``conf`` (float32 for a list).

    Args:
        conf: ``(N,)`` confidences in ``[0, 1]``.
        correct: ``(N,)`` booleans (or 0/1), whether each answer is right.
        n_bins: number of equal-width bins (see the module docstring for the bin edges).
        norm: ``"l1"`` (ECE, the bin-frequency-weighted mean gap), ``"max"`` (MCE) or ``"l2"``.

    Example:
        >>> expected_calibration_error([0.25, 0.25, 0.55, 0.75, 0.75], [0, 0, 1, 1, 1], n_bins=2)
        tensor(0.2900)
    """
    conf_t, correct_t = _as_inputs(conf, correct)
    if conf_t.numel() == 0:
        return torch.tensor(float("nan"), device=conf_t.device)
    return calibration_error_from_bin_sums(*calibration_bin_sums(conf_t, correct_t, n_bins), norm=norm).to(conf_t.dtype)


def maximum_calibration_error(
    conf: Tensor | Sequence[float], correct: Tensor | Sequence[bool], n_bins: int = 10
) -> Tensor:
    """Maximum calibration error: the largest ``|accuracy - confidence|`` over non-empty bins.

    Example:
        >>> maximum_calibration_error([0.25, 0.25, 0.55, 0.75, 0.75], [0, 0, 1, 1, 1], n_bins=2)
        tensor(0.3167)
    """
    return expected_calibration_error(conf, correct, n_bins=n_bins, norm="max")


def brier_score(conf: Tensor | Sequence[float], correct: Tensor | Sequence[bool]) -> Tensor:
    """Brier score ``mean((conf - correct) ** 2)``; lower is better.

    Example:
        >>> brier_score([1.0, 0.5, 0.0], [True, False, False])
        tensor(0.0833)
    """
    conf_t, correct_t = _as_inputs(conf, correct)
    if conf_t.numel() == 0:
        return torch.tensor(float("nan"), device=conf_t.device)
    return ((conf_t - correct_t.to(conf_t.dtype)) ** 2).mean()


def reliability_bins(
    conf: Tensor | Sequence[float], correct: Tensor | Sequence[bool], n_bins: int = 10
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-bin mean confidence, accuracy and count, for a reliability diagram: the bins of the ECE.

    All three tensors have shape ``(n_bins + 1,)``: ``n_bins`` equal-width bins ``[k/n, (k+1)/n)`` and a last slot for
    ``conf == 1.0``, kept apart as the ECE keeps it. Empty bins get confidence 0 and accuracy 0 (check ``bin_count``).

    Example:
        >>> c, a, n = reliability_bins([0.1, 0.2, 0.9, 1.0], [0, 1, 1, 0], n_bins=2)
        >>> [round(x, 4) for x in c.tolist()], a.tolist(), n.tolist()
        ([0.15, 0.9, 1.0], [0.5, 1.0, 0.0], [2.0, 1.0, 1.0])
    """
    conf_sum, correct_sum, count = calibration_bin_sums(conf, correct, n_bins)
    safe = count.clamp(min=1)
    return conf_sum / safe, correct_sum / safe, count
