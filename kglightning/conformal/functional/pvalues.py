"""Super-uniform p-values for the Learn-Then-Test null ``H0: E[L] > alpha`` (Angelopoulos et al. 2021).

All functions take calibration losses of shape ``(..., n)`` (one row per configuration of a grid) and return one
p-value per row, computed in float64.

Which p-value is valid for which loss:

* :func:`binomial_tail_pvalue` ``P(Binom(n, alpha) <= sum L)`` is exact and valid for **binary** losses
  ``L in {0, 1}`` (LTT Prop. "binomial tail bound"; UAG Theorem 2, which uses miscoverage indicators). It is *not*
  valid for general losses in ``[0, 1]``: with ``n = 1`` and a constant loss ``L = alpha`` (the null boundary) it
  always equals ``1 - alpha``, so ``P(p <= 1 - alpha) = 1 > 1 - alpha``. Non-binary losses are therefore rejected.
* :func:`hoeffding_bentkus_pvalue` is valid for any losses bounded in ``[0, 1]``; for binary losses it is never
  smaller than the binomial p-value (the binomial one is preferable there).
* :func:`betting_pvalue` (Waudby-Smith & Ramdas 2023, testing by betting) is valid for any losses in ``[0, 1]`` and
  adapts to their variance: far smaller than Hoeffding-Bentkus when the losses stay close to ``alpha``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from kglightning.conformal.functional._checks import as_float_tensor, check_level


def _losses(losses: Tensor | Sequence, binary: bool) -> Tensor:
    L = as_float_tensor(losses, "losses", dtype=torch.float64)
    if L.dim() == 0 or L.shape[-1] == 0:
        raise ValueError("losses must have shape (..., n) with n >= 1 (calibration set is empty)")
    if binary:
        if not bool(((L == 0) | (L == 1)).all()):
            raise ValueError(
                "binomial_tail_pvalue is only valid for binary losses in {0, 1}; "
                "use hoeffding_bentkus_pvalue for losses in [0, 1]"
            )
    elif not bool(((L >= 0) & (L <= 1)).all()):
        raise ValueError("losses must lie in [0, 1]")
    return L


def binomial_cdf(k: Tensor | Sequence | float, n: int, p: float) -> Tensor:
    """Exact ``P(Binom(n, p) <= k)`` for a tensor of thresholds ``k`` (floored; ``k < 0`` gives 0), float64.

    Computed in log space: ``log pmf`` via ``lgamma``, accumulated with ``logcumsumexp``, so tiny lower tails keep
    their relative accuracy. Cost ``O(n)`` once, then a gather per threshold.

    Args:
        k: thresholds, any shape.
        n: number of trials (``>= 0``).
        p: success probability in ``(0, 1)``.

    Returns:
        Float64 tensor with the shape of ``k``.

    Example:
        >>> binomial_cdf(torch.tensor([-1, 0, 1, 2, 5]), 2, 0.5)
        tensor([0.0000, 0.2500, 0.7500, 1.0000, 1.0000], dtype=torch.float64)
    """
    check_level(p, "p")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    kt = k.double() if isinstance(k, Tensor) else torch.as_tensor(k, dtype=torch.float64, device="cpu")
    kf = torch.floor(kt)
    j = torch.arange(n + 1, dtype=torch.float64, device=kf.device)
    logpmf = (
        math.lgamma(n + 1) - torch.lgamma(j + 1) - torch.lgamma(n - j + 1) + j * math.log(p) + (n - j) * math.log1p(-p)
    )
    cdf = torch.exp(torch.logcumsumexp(logpmf, dim=0)).clamp(max=1.0)
    idx = kf.clamp(0, n).long()
    out = cdf[idx]
    out = torch.where(kf < 0, torch.zeros_like(out), out)
    return torch.where(kf >= n, torch.ones_like(out), out)


def student_t_sf(t: float, df: int) -> float:
    """``P(T > t)`` for Student's t distribution with an integer ``df >= 1``, exactly (the finite series of
    Abramowitz & Stegun 26.7.3 and 26.7.4, with ``theta = atan(|t| / sqrt(df))``).

    Example:
        >>> round(student_t_sf(2.0, 19), 5), student_t_sf(0.0, 5), round(student_t_sf(-1.0, 1), 5)
        (0.03, 0.5, 0.75)
    """
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if math.isnan(t):
        raise ValueError("t is NaN")
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    theta = math.atan(abs(t) / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    term = total = 1.0
    if df % 2 == 0:  # P(|T| < |t|) = sin(theta) (1 + 1/2 c2 + 1.3/(2.4) c2^2 + ... up to c2^((df - 2)/2))
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        inside = math.sin(theta) * total
    else:  # 2/pi (theta + sin cos (1 + 2/3 c2 + ... up to c2^((df - 3)/2)))
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        inside = 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1 else 0.0))
    upper = max(0.0, (1.0 - inside) / 2)
    return upper if t >= 0 else 1.0 - upper


def binomial_tail_pvalue(losses: Tensor | Sequence, alpha: float) -> Tensor:
    """Binomial tail p-value ``P(Binom(n, alpha) <= sum_i L_i)`` for binary losses, one per row.

    Valid (super-uniform) under ``H0: E[L] > alpha`` when the ``n`` losses are i.i.d. in ``{0, 1}``; see the module
    docstring for why bounded non-binary losses are rejected.

    Args:
        losses: binary losses of shape ``(..., n)`` (e.g. miscoverage indicators, one row per configuration).
        alpha: target risk level in ``(0, 1)``.

    Returns:
        Float64 p-values of shape ``losses.shape[:-1]``.

    Example:
        >>> losses = torch.tensor([[0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [1, 0, 1, 0, 1, 0, 1, 0, 1, 0]])
        >>> binomial_tail_pvalue(losses, 0.2)  # (0.8 ** 10, P(Binom(10, 0.2) <= 5))
        tensor([0.1074, 0.9936], dtype=torch.float64)
    """
    check_level(alpha, "alpha")
    L = _losses(losses, binary=True)
    return binomial_cdf(L.sum(dim=-1), L.shape[-1], float(alpha))


def hoeffding_bentkus_pvalue(losses: Tensor | Sequence, alpha: float) -> Tensor:
    """Hoeffding-Bentkus p-value (LTT, Angelopoulos et al. 2021) for losses bounded in ``[0, 1]``, one per row.

    ``p = min(exp(-n h1(min(R, alpha), alpha)), e * P(Binom(n, alpha) <= ceil(n R)))`` with ``R`` the empirical
    risk and ``h1(a, b) = a log(a / b) + (1 - a) log((1 - a) / (1 - b))``; clipped to at most 1.

    Args:
        losses: losses in ``[0, 1]`` of shape ``(..., n)``.
        alpha: target risk level in ``(0, 1)``.

    Returns:
        Float64 p-values of shape ``losses.shape[:-1]``.

    Example:
        >>> hoeffding_bentkus_pvalue(torch.zeros(1, 50), 0.1)  # Hoeffding term (0.9 ** 50) wins
        tensor([0.0052], dtype=torch.float64)
        >>> hoeffding_bentkus_pvalue(torch.full((1, 50), 0.5), 0.1)  # risk above alpha: no evidence
        tensor([1.], dtype=torch.float64)
    """
    check_level(alpha, "alpha")
    L = _losses(losses, binary=False)
    n = L.shape[-1]
    total = L.sum(dim=-1)
    a = torch.clamp(total / n, max=alpha)
    h1 = torch.xlogy(a, a) - a * math.log(alpha) + torch.xlogy(1 - a, 1 - a) - (1 - a) * math.log1p(-alpha)
    h1 = torch.where(total >= n * alpha, torch.zeros_like(h1), h1.clamp(min=0.0))  # exact 1 at/above alpha
    hoeffding = torch.exp(-n * h1)
    bentkus = math.e * binomial_cdf(torch.ceil(total), n, float(alpha))
    return torch.minimum(hoeffding, bentkus).clamp(max=1.0)


def betting_pvalue(
    losses: Tensor | Sequence, alpha: float, delta: float = 0.1, generator: torch.Generator | None = None
) -> Tensor:
    """Testing-by-betting p-value for ``H0: E[L] > alpha``, losses in ``[0, 1]``, one per row (float64).

    The wealth ``K_i = prod_{j <= i} (1 + lambda_j (alpha - L_j))`` of a bettor against ``H0`` is a nonnegative
    supermartingale under it, so by Ville's inequality ``p = min(1, 1 / max_i K_i)`` is a valid p-value. The bets
    are predictable (each uses only the losses before it): ``lambda_j = min(1 / (2 (1 - alpha)), sqrt(2 log(1 /
    delta) / (n sigma_j^2)))`` with ``sigma_j^2`` the running variance (Waudby-Smith & Ramdas 2023, predictable
    plug-in, tuned for level ``delta``). The losses are visited in an order drawn from ``generator`` (every row in the
    same order), which must not depend on them.

    Args:
        losses: losses in ``[0, 1]`` of shape ``(..., n)``.
        alpha: target risk level in ``(0, 1)``.
        delta: the level the bets are tuned for (any value gives a valid p-value).
        generator: seeds the visiting order (``None``: the index order).

    Returns:
        Float64 p-values of shape ``losses.shape[:-1]``.

    Example:
        >>> L = torch.full((1, 200), 0.15)
        >>> L[0, ::10] = 0.5  # mean 0.185, always close to alpha = 0.2
        >>> betting_pvalue(L, 0.2) < hoeffding_bentkus_pvalue(L, 0.2)
        tensor([True])
        >>> betting_pvalue(torch.full((1, 50), 0.5), 0.2)  # risk above alpha: no evidence
        tensor([1.], dtype=torch.float64)
    """
    check_level(alpha, "alpha")
    check_level(delta, "delta")
    L = _losses(losses, binary=False)
    n = L.shape[-1]
    if generator is not None:
        L = L[..., torch.randperm(n, generator=generator, device="cpu").to(L.device)]
    i = torch.arange(1, n + 1, dtype=torch.float64, device=L.device)
    mean = (0.5 + torch.cumsum(L, dim=-1)) / (i + 1)  # running mean with a prior point at 1/2
    prev_mean = torch.cat([torch.full_like(mean[..., :1], 0.5), mean[..., :-1]], dim=-1)
    sq = torch.cumsum((L - prev_mean) ** 2, dim=-1)
    var = (0.25 + sq) / (i + 1)
    prev_var = torch.cat([torch.full_like(var[..., :1], 0.25), var[..., :-1]], dim=-1)
    lam = torch.sqrt(2 * math.log(1 / delta) / (n * prev_var)).clamp(max=0.5 / (1 - alpha))
    log_wealth = torch.cumsum(torch.log1p(lam * (alpha - L)), dim=-1)
    return torch.exp(-log_wealth.max(dim=-1).values.clamp(min=0.0))
