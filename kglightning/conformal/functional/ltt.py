"""Family-wise error rate (FWER) procedures and Learn-Then-Test configuration selection.

Each procedure takes one p-value per configuration (for ``H0_j: E[L_j] > alpha``) and returns the boolean mask of
*valid* configurations (rejected nulls). With FWER control at ``delta``, the probability that *any* returned
configuration has true risk above ``alpha`` is at most ``delta``; because that guarantee is simultaneous, any rule
may then pick among the valid ones.

* :func:`bonferroni`: reject when ``p_j <= delta / K``; valid under arbitrary dependence between p-values.
* :func:`fixed_sequence`: test in a fixed order at level ``delta`` and stop at the first non-rejection; valid only if
  the order is chosen *before* looking at the calibration data (e.g. from most to least conservative threshold).

UAG's reference code instead keeps the configuration with the largest p-value and tests it at ``delta`` (Bonferroni
with ``n = 1``, appendix); choosing the hypothesis by its p-value does not control the FWER, so it is not offered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from kglightning.conformal.functional._checks import as_float_tensor, check_level
from kglightning.conformal.functional.pvalues import binomial_tail_pvalue, hoeffding_bentkus_pvalue


def _pvalues(pvalues: Tensor | Sequence) -> Tensor:
    p = as_float_tensor(pvalues, "pvalues", dtype=torch.float64)
    if p.dim() == 0 or p.shape[-1] == 0:
        raise ValueError("pvalues must have shape (..., K) with K >= 1")
    if not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError("pvalues must lie in [0, 1]")
    return p


def bonferroni(pvalues: Tensor | Sequence, delta: float) -> Tensor:
    """Bonferroni correction: configuration ``j`` is valid when ``p_j <= delta / K``.

    Args:
        pvalues: p-values of shape ``(..., K)``, one per configuration.
        delta: FWER level in ``(0, 1)``.

    Returns:
        Boolean mask of shape ``(..., K)``, ``True`` = valid configuration.

    Example:
        >>> bonferroni(torch.tensor([0.001, 0.03, 0.02, 0.5]), 0.1)  # threshold 0.025
        tensor([ True, False,  True, False])
    """
    check_level(delta, "delta")
    p = _pvalues(pvalues)
    return p <= delta / p.shape[-1]


def fixed_sequence(pvalues: Tensor | Sequence, delta: float, order: Tensor | Sequence | None = None) -> Tensor:
    """Fixed-sequence testing: test in ``order`` at level ``delta``; stop at the first ``p > delta``.

    Args:
        pvalues: p-values of shape ``(..., K)``, one per configuration.
        delta: FWER level in ``(0, 1)``.
        order: a permutation of ``range(K)`` giving the testing order (most conservative first). ``None`` means the
            index order ``0, 1, ..., K - 1``. It must not depend on the calibration data.

    Returns:
        Boolean mask of shape ``(..., K)``: the valid configurations, a prefix of ``order``.

    Example:
        >>> p = torch.tensor([0.01, 0.04, 0.2, 0.03])
        >>> fixed_sequence(p, 0.05)  # stops at index 2; index 3 is never tested
        tensor([ True,  True, False, False])
        >>> fixed_sequence(p, 0.05, order=[3, 0, 1, 2])
        tensor([ True,  True, False,  True])
    """
    check_level(delta, "delta")
    p = _pvalues(pvalues)
    K = p.shape[-1]
    if order is None:
        perm = torch.arange(K, device=p.device)
    else:
        perm = torch.as_tensor(order, dtype=torch.long, device=p.device)
        if perm.shape != (K,) or not torch.equal(torch.sort(perm).values, torch.arange(K, device=p.device)):
            raise ValueError(f"order must be a permutation of range({K})")
    rejected_in_order = torch.cumprod((p[..., perm] <= delta).to(torch.int64), dim=-1).bool()
    out = torch.zeros_like(rejected_in_order)
    out[..., perm] = rejected_in_order
    return out


class LTTResult(NamedTuple):
    """Result of :func:`ltt_select`.

    Attributes:
        index: the selected configuration, or ``None`` when no configuration is valid (abstain: the caller must not
            fall back to an uncalibrated configuration silently).
        valid: boolean mask ``(K,)`` of configurations certified to have risk ``<= alpha`` (FWER ``<= delta``).
        pvalues: ``(K,)`` p-values of the nulls ``E[L_j] > alpha``.
        mean_set_size: ``(K,)`` mean set size on the selection split.
    """

    index: int | None
    valid: Tensor
    pvalues: Tensor
    mean_set_size: Tensor


def ltt_select(
    cal_losses: Tensor | Sequence,
    sel_set_sizes: Tensor | Sequence,
    alpha: float,
    delta: float,
    procedure: Literal["fixed_sequence", "bonferroni"] = "fixed_sequence",
    pvalue: Literal["binomial", "hoeffding_bentkus"] = "binomial",
    order: Tensor | Sequence | None = None,
) -> LTTResult:
    """Learn-Then-Test: certify configurations on a calibration split, pick the smallest sets on a selection split.

    Calibration losses and selection set sizes come from *two disjoint splits* (as in UAG): the p-values only see
    ``cal_losses`` and the choice only sees ``sel_set_sizes``. Ties in mean set size go to the lowest index.

    Args:
        cal_losses: ``(K, n_cal)`` losses of each configuration on the calibration split; binary for
            ``pvalue="binomial"``, in ``[0, 1]`` for ``pvalue="hoeffding_bentkus"``.
        sel_set_sizes: ``(K, n_sel)`` set sizes on the selection split, or their means ``(K,)``.
        alpha: target risk in ``(0, 1)``.
        delta: FWER level in ``(0, 1)``.
        procedure: ``"fixed_sequence"`` (uses ``order``) or ``"bonferroni"``.
        pvalue: ``"binomial"`` (binary losses) or ``"hoeffding_bentkus"`` (bounded losses).
        order: testing order for ``"fixed_sequence"``; default index order (put the most conservative first).

    Returns:
        :class:`LTTResult` with the chosen index (``None`` = abstain), the valid mask, the p-values and mean sizes.

    Example:
        >>> cal = torch.zeros(3, 100)
        >>> cal[1, :5] = 1  # risk 0.05
        >>> cal[2, :30] = 1  # risk 0.30
        >>> res = ltt_select(cal, torch.tensor([9.0, 4.0, 1.0]), alpha=0.2, delta=0.1)
        >>> res.index, res.valid
        (1, tensor([ True,  True, False]))
        >>> ltt_select(torch.ones(3, 100), torch.ones(3), alpha=0.2, delta=0.1).index is None  # abstain
        True
    """
    check_level(alpha, "alpha")
    check_level(delta, "delta")
    L = as_float_tensor(cal_losses, "cal_losses", dtype=torch.float64)
    if L.dim() != 2:
        raise ValueError(f"cal_losses must have shape (K, n_cal), got {tuple(L.shape)}")
    sizes = as_float_tensor(sel_set_sizes, "sel_set_sizes", dtype=torch.float64)
    if sizes.dim() == 2:
        if sizes.shape[1] == 0:
            raise ValueError("selection split is empty")
        sizes = sizes.mean(dim=1)
    if sizes.shape != (L.shape[0],):
        raise ValueError(f"sel_set_sizes must have shape (K, n_sel) or (K,) with K={L.shape[0]}")
    if pvalue == "binomial":
        p = binomial_tail_pvalue(L, alpha)
    elif pvalue == "hoeffding_bentkus":
        p = hoeffding_bentkus_pvalue(L, alpha)
    else:
        raise ValueError(f"unknown pvalue {pvalue!r}")
    if procedure == "fixed_sequence":
        valid = fixed_sequence(p, delta, order)
    elif procedure == "bonferroni":
        valid = bonferroni(p, delta)
    else:
        raise ValueError(f"unknown procedure {procedure!r}")
    if not bool(valid.any()):
        return LTTResult(None, valid, p, sizes)
    masked = torch.where(valid, sizes, torch.full_like(sizes, float("inf")))
    return LTTResult(int(torch.argmin(masked)), valid, p, sizes)
