"""Two-sample comparison of calibration and test data: whether they look drawn alike.

A conformal guarantee holds for test units exchangeable with the calibration units. What a unit looks like before
its label is seen (how many answers a question has) can be compared between the two sides: a clear difference
means they are not drawn alike, and the guarantee does not apply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from kglightning.conformal.functional._checks import as_float_tensor


def kolmogorov_sf(x: float) -> float:
    """``P(K > x)`` for the Kolmogorov distribution: ``2 sum_{k >= 1} (-1)^(k-1) exp(-2 k^2 x^2)`` (1 for ``x``
    near 0, where the series converges slowly and the probability is 1 to many digits).

    Example:
        >>> round(kolmogorov_sf(1.36), 3)  # the 5% critical value
        0.049
    """
    if x < 0.2:
        return 1.0
    total = sum((-1) ** (k - 1) * math.exp(-2 * k * k * x * x) for k in range(1, 101))
    return min(1.0, max(0.0, 2 * total))


def ks_two_sample(x: Tensor | Sequence, y: Tensor | Sequence) -> tuple[float, float]:
    """The two-sample Kolmogorov-Smirnov statistic ``D = max_v |F_x(v) - F_y(v)|`` and its asymptotic p-value.

    The p-value is ``kolmogorov_sf((sqrt(n_e) + 0.12 + 0.11 / sqrt(n_e)) D)`` with ``n_e = n m / (n + m)``
    (Stephens' small-sample correction). On discrete data (counts with ties) it is conservative: the test rejects
    no more often than its level when both samples come from one distribution.

    Args:
        x: ``(n,)`` first sample.
        y: ``(m,)`` second sample.

    Returns:
        ``(D, p)``; ``(0.0, 1.0)`` when a sample is empty.

    Example:
        >>> d, p = ks_two_sample([2, 2, 2, 2, 2, 2, 2, 2, 2], [9, 10, 10, 11, 10, 9, 10, 12, 10])
        >>> d, p < 1e-3
        (1.0, True)
    """
    a = torch.sort(as_float_tensor(x, "x", dtype=torch.float64).flatten()).values
    b = torch.sort(as_float_tensor(y, "y", dtype=torch.float64).flatten()).values
    n, m = a.numel(), b.numel()
    if n == 0 or m == 0:
        return 0.0, 1.0
    at = torch.cat([a, b])
    cdf_a = torch.searchsorted(a, at, right=True).double() / n
    cdf_b = torch.searchsorted(b, at, right=True).double() / m
    d = float((cdf_a - cdf_b).abs().max())
    ne = math.sqrt(n * m / (n + m))
    return d, kolmogorov_sf((ne + 0.12 + 0.11 / ne) * d)


def summary(x: Tensor | Sequence) -> dict[str, float]:
    """``n``, ``mean``, quartiles (``q25``, ``median``, ``q75``), ``min`` and ``max`` of a sample (NaN when empty).

    Example:
        >>> summary([1, 2, 3, 4, 10])
        {'n': 5, 'mean': 4.0, 'q25': 2.0, 'median': 3.0, 'q75': 4.0, 'min': 1.0, 'max': 10.0}
    """
    v = as_float_tensor(x, "x", dtype=torch.float64).flatten()
    if v.numel() == 0:
        nan = float("nan")
        return {"n": 0, "mean": nan, "q25": nan, "median": nan, "q75": nan, "min": nan, "max": nan}
    q = torch.quantile(v, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64, device=v.device)).tolist()
    return {
        "n": v.numel(), "mean": float(v.mean()), "q25": q[0], "median": q[1], "q75": q[2],
        "min": float(v.min()), "max": float(v.max()),
    }  # fmt: skip
