"""Split-conformal quantile and prediction sets.

Convention: scores are *non-conformity* scores, lower = more conforming (e.g. ``1 - p(y | x)``). A candidate ``y`` is
in the prediction set of ``x`` when ``s(x, y) <= qhat``.

The threshold is the exact finite-sample one: the ``k = ceil((n + 1)(1 - alpha))``-th smallest of the ``n``
calibration scores, and ``+inf`` when ``k > n`` (too few calibration points for level ``alpha``: the only valid set
is the full candidate set). With exchangeable calibration and test scores this gives
``P(s_test <= qhat) >= 1 - alpha``, and ``<= 1 - alpha + 1 / (n + 1)`` when scores have no ties. This differs from
UAG's reference code, which uses ``np.quantile`` with interpolation and no ceiling (anti-conservative).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from kglightning.conformal.functional._checks import as_float_tensor, check_level

# (n + 1)(1 - alpha) within this (relative) distance of an integer is taken to be that integer, so that a decimal
# alpha such as 0.3 (stored as 0.29999999999999998890) gives the rank the user wrote down.
_RANK_TOL = 1e-9


def conformal_rank(n: int, alpha: float | Tensor) -> Tensor:
    """The rank ``k = ceil((n + 1)(1 - alpha))`` of the split-conformal quantile.

    Args:
        n: number of calibration scores (``>= 1``).
        alpha: miscoverage level(s) in ``(0, 1)``, a float or a tensor of any shape.

    Returns:
        A ``long`` tensor with the shape of ``alpha``. Values above ``n`` mean "threshold is +inf".

    Example:
        >>> conformal_rank(9, 0.1)
        tensor(9)
        >>> conformal_rank(19, torch.tensor([0.05, 0.3, 0.01]))
        tensor([19, 14, 20])
    """
    if n < 1:
        raise ValueError(f"calibration set is empty (n={n})")
    check_level(alpha, "alpha")
    a = alpha.double() if isinstance(alpha, Tensor) else torch.tensor(alpha, dtype=torch.float64, device="cpu")
    x = (n + 1) * (1.0 - a)
    return torch.ceil(x - _RANK_TOL * torch.clamp(x, min=1.0)).long()


def conformal_min_n(alpha: float) -> int:
    """The fewest calibration scores that give a finite threshold: the smallest ``n >= 1`` with
    ``conformal_rank(n, alpha) <= n``.

    In exact arithmetic that is ``n >= (1 - alpha) / alpha``; with the rank's tolerance for decimal ``alpha``-s it is
    ``n >= c / (1 - c)``, ``c = (1 - alpha)(1 - tol)``, which bounds it near ``1e9`` for a vanishing ``alpha``. The
    closed form is exact up to rounding, so the rank's own float expression is evaluated on a window of ``n`` around
    it (a few values, some thousands for ``alpha`` below ``1e-7``, where rounding blurs the boundary) and the first
    ``n`` that passes is returned: the answer of counting ``n`` up from 1, at the cost of one vector operation.

    Example:
        >>> conformal_min_n(0.1), conformal_min_n(0.05), conformal_min_n(1 / 3), conformal_min_n(0.7)
        (9, 19, 2, 1)
        >>> conformal_min_n(1e-300)  # the rank's tolerance: about 1 / tol
        999999940
    """
    check_level(alpha, "alpha")
    a = float(alpha)
    c = (1.0 - a) * (1.0 - _RANK_TOL)
    guess = c / (1.0 - c)
    width = int(16 * 2.3e-16 * (guess + 2) / (1.0 - c)) + 4  # rounding error of the guess and of the rank
    one_minus = 1.0 - torch.tensor(a, dtype=torch.float64, device="cpu")
    while True:
        lo, hi = max(1, math.floor(guess) - width), math.ceil(guess) + width
        n = torch.arange(lo, hi + 1, dtype=torch.float64, device="cpu")
        x = (n + 1) * one_minus  # the float operations of conformal_rank, one n per element
        ok = torch.ceil(x - _RANK_TOL * torch.clamp(x, min=1.0)) <= n
        if bool(ok[-1]) and (lo == 1 or not bool(ok[0])):
            return lo + int(ok.nonzero()[0])
        width *= 4  # not reached: the window holds the boundary


def conformal_quantile(scores: Tensor | Sequence, alpha: float | Tensor) -> Tensor:
    """Split-conformal threshold: the ``ceil((n+1)(1-alpha))``-th smallest calibration score, ``+inf`` if that rank > n.

    Vectorised over leading dimensions: one threshold per row of ``scores`` (e.g. one per configuration of a grid).
    Ties need no special treatment: the ``k``-th order statistic is the smallest ``t`` with ``#{s_i <= t} >= k``.

    Args:
        scores: calibration non-conformity scores, shape ``(..., n)``; ``+inf`` entries are allowed, NaN is not.
        alpha: miscoverage level in ``(0, 1)``: a float, or a tensor broadcastable to ``scores.shape[:-1]``.

    Returns:
        Thresholds of shape ``broadcast(scores.shape[:-1], alpha.shape)``, in the floating dtype of ``scores``
        (float64 for integer input).

    Example:
        >>> s = torch.tensor([0.1, 0.4, 0.2, 0.9, 0.3, 0.5, 0.8, 0.6, 0.7])  # n = 9
        >>> conformal_quantile(s, 0.2)  # k = ceil(10 * 0.8) = 8
        tensor(0.8000)
        >>> conformal_quantile(s, 0.05)  # k = ceil(9.5) = 10 > n: no finite threshold is valid
        tensor(inf)
        >>> conformal_quantile(torch.stack([s, 2 * s]), torch.tensor([0.2, 0.5]))  # one per row
        tensor([0.8000, 1.0000])
    """
    s = as_float_tensor(scores, "scores")
    if s.dim() == 0:
        raise ValueError("scores must have at least one dimension (..., n)")
    n = s.shape[-1]
    if n == 0:
        raise ValueError("calibration set is empty (scores.shape[-1] == 0)")
    k = conformal_rank(n, alpha)
    if k.dim() == 0:  # one rank for every row: an O(n) selection instead of a sort
        if int(k) > n:
            return torch.full(s.shape[:-1], math.inf, dtype=s.dtype, device=s.device)
        return torch.kthvalue(s, int(k), dim=-1).values
    batch = torch.broadcast_shapes(s.shape[:-1], k.shape)
    sorted_s = torch.sort(s, dim=-1).values.expand(*batch, n)
    k = k.to(s.device).expand(batch)
    picked = torch.gather(sorted_s, -1, (k.clamp(1, n) - 1).unsqueeze(-1)).squeeze(-1)
    return torch.where(k > n, torch.full_like(picked, math.inf), picked)


def unit_scores(
    scores: Tensor | Sequence,
    units: Tensor | Sequence,
    per_unit: Literal["one", "every"] = "one",
    generator: torch.Generator | None = None,
) -> Tensor:
    """One calibration score per exchangeable unit (e.g. a question) from the scores of its items (its answers).

    When items cluster in units (the answers of one question depend on each other), the units, not the items, are
    exchangeable, and a threshold fitted on every item counts the items in its finite-sample rank: it under-covers
    (a group of 5 questions with 10 answers each gets a finite threshold from 50 items). The split-conformal
    quantile of one score per unit, with the rank on the number of units, keeps its promise for exchangeable units:

    * ``"one"``: the score of one item of the unit, drawn uniformly at random (independently of the scores). The
      ``n`` drawn scores and the score of a random item of a test unit are exchangeable, so the threshold covers a
      random item of a test unit with probability ``>= 1 - alpha``: the expected share of a test unit's items that
      are covered, each unit weighing one, is ``>= 1 - alpha``.
    * ``"every"``: the largest score of the unit's items; the threshold covers *every* item of a test unit with
      probability ``>= 1 - alpha`` (stronger, and larger sets).

    Args:
        scores: ``(N,)`` per-item calibration scores (``+-inf`` allowed, NaN not).
        units: ``(N,)`` integer unit ids.
        per_unit: ``"one"`` or ``"every"``, see above.
        generator: seeds the draws of ``"one"``.

    Returns:
        ``(n_units,)`` scores, one per distinct unit id, in increasing id order, in the dtype of ``scores``.

    Example:
        >>> s, u = torch.tensor([0.2, 0.9, 0.4, 0.1]), torch.tensor([7, 7, 3, 7])
        >>> unit_scores(s, u, "every")
        tensor([0.4000, 0.9000])
        >>> picked = unit_scores(s, u, "one", torch.Generator().manual_seed(0))  # unit 3's only item, one of unit 7's
        >>> picked[0].item() == s[2].item(), picked[1].item() in s[u == 7].tolist()
        (True, True)
    """
    s = as_float_tensor(scores, "scores").flatten()
    u = torch.as_tensor(units, device=s.device).flatten()
    if u.numel() != s.numel():
        raise ValueError(f"units has {u.numel()} entries for {s.numel()} scores")
    if u.is_floating_point() or u.dtype == torch.bool:
        raise ValueError(f"units must be integer ids, got dtype {u.dtype}")
    if per_unit not in ("one", "every"):
        raise ValueError(f"per_unit must be 'one' or 'every', got {per_unit!r}")
    ids, inverse = torch.unique(u, return_inverse=True)
    if per_unit == "every":
        out = torch.full((ids.numel(),), -math.inf, dtype=s.dtype, device=s.device)
        return out.scatter_reduce(0, inverse, s, reduce="amax", include_self=True)
    draw = torch.rand(s.shape, generator=generator, dtype=torch.float64, device="cpu").to(s.device)
    order = torch.argsort(draw)
    order = order[torch.argsort(inverse[order], stable=True)]  # by unit, then draw: the first of each is the pick
    first = torch.ones(order.numel(), dtype=torch.bool, device=s.device)
    first[1:] = inverse[order][1:] != inverse[order][:-1]
    return s[order[first]]


def prediction_sets(scores: Tensor | Sequence, qhat: float | Tensor) -> Tensor:
    """Conformal prediction sets as a boolean mask: ``scores <= qhat``.

    A ``+inf`` threshold (calibration set too small for ``alpha``) yields the *full* candidate set, which is the
    correct, honest output; callers that report set sizes should surface it rather than hide it. Mask out padded
    candidates yourself (``sets & valid``).

    Args:
        scores: non-conformity scores of shape ``(..., B, C)`` (questions x candidates), lower = more conforming.
        qhat: a scalar threshold, or one per leading configuration, of shape ``scores.shape[:-2]``.

    Returns:
        Boolean tensor with the shape of ``scores``; ``True`` = candidate is in the set.

    Example:
        >>> scores = torch.tensor([[0.1, 0.7, 0.3], [0.9, 0.2, 0.6]])
        >>> prediction_sets(scores, 0.5)
        tensor([[ True, False,  True],
                [False,  True, False]])
        >>> prediction_sets(scores, float("inf")).all()  # too few calibration points: full set
        tensor(True)
        >>> prediction_sets(torch.stack([scores, scores]), torch.tensor([0.2, 0.65])).sum(dim=(-2, -1))
        tensor([2, 4])
    """
    s = as_float_tensor(scores, "scores")
    if s.dim() < 2:
        raise ValueError(f"scores must have shape (..., B, C), got {tuple(s.shape)}")
    q = as_float_tensor(qhat, "qhat", dtype=s.dtype)
    if q.dim() > 0:
        if tuple(q.shape) != tuple(s.shape[:-2]):
            raise ValueError(f"qhat must be a scalar or of shape {tuple(s.shape[:-2])}, got {tuple(q.shape)}")
        q = q[..., None, None]
    return s <= q
