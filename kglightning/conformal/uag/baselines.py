"""The two non-traversal baselines of UAG's table, on the same candidate pool and encoder as UAG.

Each candidate entity gets one score, its retrieval distance: the smallest Eq. 5 score ``1 - cos(Q, path)`` over
the paths that reach it (:func:`candidate_scores`).

* :class:`SplitCP`: plain split conformal prediction. A calibration question's score is the candidate score of its
  best gold answer (``coverage="any"``) or of its worst one (``"all"``), ``+inf`` when the pool misses it; the
  threshold is the exact ``ceil((n+1)(1-alpha))``-th smallest. When that rank exceeds the finite scores, the
  threshold is ``+inf``: every question gets its full pool and the result is flagged ``abstained``.
* :class:`TopK`: the ``K`` best candidates, with ``K`` the smallest value whose *empirical* coverage on the
  calibration pool reaches ``1 - alpha``; no finite-sample correction, hence no guarantee (as in the paper). When
  no ``K`` reaches it, it abstains the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from kglightning.conformal.functional import conformal_quantile
from kglightning.conformal.uag.scores import Coverage, QuestionScores


def candidate_scores(s: QuestionScores) -> Tensor:
    """``(A,)`` retrieval distance of each candidate (lower = better)."""
    return s.entity_path_min(s.path_score)


def covers(s: QuestionScores, member: Tensor, coverage: Coverage = "any") -> bool:
    """Whether the set ``member`` (``(A,)`` bool) covers the question's gold answers."""
    if s.n_gold == 0:
        return False
    if coverage == "any":
        return bool((member & s.gold).any())
    return int(s.gold.sum()) == s.n_gold and bool(member[s.gold].all())


def _gold_stat(values: Tensor, s: QuestionScores, coverage: Coverage) -> float:
    gold = values[s.gold]
    if s.n_gold == 0 or gold.numel() == 0 or (coverage == "all" and gold.numel() < s.n_gold):
        return float("inf")
    return float(gold.min() if coverage == "any" else gold.max())


def ranks(s: QuestionScores) -> Tensor:
    """1-based rank of each candidate by score (ties: name order)."""
    order = torch.argsort(candidate_scores(s), stable=True)
    out = torch.empty_like(order)
    out[order] = torch.arange(1, len(order) + 1, device=order.device)
    return out


class SplitCP:
    """Split conformal prediction on the candidate scores (see the module docstring)."""

    name = "split_cp"

    def __init__(self, coverage: Coverage = "any") -> None:
        self.coverage = coverage
        self.qhat: float | None = None
        self.alpha: float | None = None

    def fit(self, pool: Sequence[QuestionScores], alpha: float) -> SplitCP:
        stats = [_gold_stat(candidate_scores(s), s, self.coverage) for s in pool]
        cal = torch.tensor(stats, dtype=torch.float64, device="cpu")
        self.qhat, self.alpha = float(conformal_quantile(cal, alpha)), alpha
        return self

    @property
    def abstained(self) -> bool:
        return self.qhat is not None and self.qhat == float("inf")

    def member(self, s: QuestionScores) -> Tensor:
        if self.qhat is None:
            raise RuntimeError("call fit() first")
        return candidate_scores(s).double() <= self.qhat

    def summary(self) -> dict[str, Any]:
        qhat = None if self.abstained else self.qhat  # null when +inf: strict JSON has no Infinity
        return {"alpha": self.alpha, "qhat": qhat, "abstained": self.abstained}


class TopK:
    """The ``K`` best candidates, ``K`` set from empirical calibration coverage (see the module docstring)."""

    name = "top_k"

    def __init__(self, coverage: Coverage = "any") -> None:
        self.coverage = coverage
        self.k: int | None = None
        self.alpha: float | None = None
        self._abstained = False

    def fit(self, pool: Sequence[QuestionScores], alpha: float) -> TopK:
        need = torch.tensor([_gold_stat(ranks(s).double(), s, self.coverage) for s in pool], device="cpu")
        finite = need[torch.isfinite(need)].sort().values
        target = (1 - alpha) * len(pool)
        m = int(torch.ceil(torch.tensor(target - 1e-9, device="cpu")))  # questions that must be covered
        self.alpha = alpha
        self._abstained = m > len(finite)
        self.k = None if self._abstained else max(1, int(finite[m - 1]) if m > 0 else 1)
        return self

    @property
    def abstained(self) -> bool:
        return self._abstained

    def member(self, s: QuestionScores) -> Tensor:
        if self.alpha is None:
            raise RuntimeError("call fit() first")
        if self.k is None:
            return torch.ones(s.num_entities, dtype=torch.bool, device=s.expand.device)
        return ranks(s) <= self.k

    def summary(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "k": self.k, "abstained": self.abstained}


def evaluate_members(
    scores: Sequence[QuestionScores], members: Sequence[Tensor], coverage: Coverage = "any"
) -> dict[str, float]:
    """Empirical coverage (ECR) and average set size (APSS) of one set per question."""
    n = max(len(scores), 1)
    ecr = sum(covers(s, m, coverage) for s, m in zip(scores, members)) / n
    apss = sum(int(m.sum()) for m in members) / n
    return {"ecr": ecr, "apss": apss}
