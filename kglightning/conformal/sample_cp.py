"""Top-K and split CP on the LLM's own answer probabilities (UAG's Table 1 baselines), over sampled answers.

Each distinct sampled answer of a question is ranked by its *LLM score*: its sample frequency
(``rank_by="frequency"``) or its likelihood, the best quality (length-normalised sequence probability) among the
samples that gave it (``rank_by="likelihood"``). An answer never sampled has no score and can never be in a set.

* :class:`SampleSplitCP`: split conformal prediction with non-conformity ``1 - score``; a calibration question's
  score is that of its best gold answer (``coverage="any"``) or worst (``"all"``), ``+inf`` when unsampled; the
  threshold is the exact ``⌈(n+1)(1-α)⌉``-th smallest, ``+inf`` (every sampled answer, flagged ``abstained``)
  when that rank is beyond the finite scores.
* :class:`SampleTopK`: the ``K`` best-scored answers, ``K`` the smallest value whose *empirical* calibration coverage
  reaches ``1 - α`` (no finite-sample correction, no guarantee, as in the paper); it abstains the same way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from kglightning.conformal.sampling import Coverage, SampledAnswers, SplitConformalSets, gold_value

__all__ = ["SampleSplitCP", "SampleTopK", "answer_scores"]

RankBy = Literal["frequency", "likelihood"]


def answer_scores(q: SampledAnswers, rank_by: RankBy = "frequency") -> dict[str, float]:
    """Each distinct sampled answer's LLM score, best first (ties: the first sampled first).

    Example:
        >>> q = SampledAnswers(("a", "b", "a", ""), frozenset(), quality=(0.2, 0.9, 0.4, 0.0))
        >>> answer_scores(q)
        {'a': 0.5, 'b': 0.25}
        >>> answer_scores(q, "likelihood")
        {'b': 0.9, 'a': 0.4}
    """
    if rank_by == "frequency":
        return q.frequencies()
    if rank_by != "likelihood":
        raise ValueError(f"rank_by must be 'frequency' or 'likelihood', got {rank_by!r}")
    best: dict[str, float] = {}
    for y, qual in zip(q.samples, q.sample_quality()):
        if y:
            best[y] = max(best.get(y, -math.inf), qual)
    return dict(sorted(best.items(), key=lambda kv: -kv[1]))


class SampleSplitCP(SplitConformalSets):
    """Split CP on ``1 -`` the LLM score of each sampled answer (see the module docstring)."""

    def __init__(self, rank_by: RankBy = "frequency", coverage: Coverage = "any") -> None:
        self.rank_by = rank_by
        self.coverage = coverage
        self.qhat: float | None = None
        self.alpha: float | None = None

    @property
    def name(self) -> str:
        return f"split_cp_{self.rank_by}"

    def nonconformity(self, q: SampledAnswers) -> dict[str, float]:
        return {y: 1.0 - s for y, s in answer_scores(q, self.rank_by).items()}


class SampleTopK:
    """The ``K`` best sampled answers by LLM score, ``K`` from empirical calibration coverage (module docstring)."""

    def __init__(self, rank_by: RankBy = "frequency", coverage: Coverage = "any") -> None:
        self.rank_by = rank_by
        self.coverage = coverage
        self.k: int | None = None
        self.alpha: float | None = None
        self._abstained = False

    @property
    def name(self) -> str:
        return f"top_k_{self.rank_by}"

    def fit(self, calibration: Sequence[SampledAnswers], alpha: float) -> SampleTopK:
        need = []  # the rank K a question needs to be covered (+inf: never)
        for q in calibration:
            ranks = {y: float(i + 1) for i, y in enumerate(answer_scores(q, self.rank_by))}
            need.append(gold_value(ranks, q, self.coverage))
        finite = sorted(k for k in need if k != math.inf)
        m = math.ceil((1 - alpha) * len(calibration) - 1e-9)  # questions that must be covered
        self.alpha, self._abstained = alpha, m > len(finite)
        self.k = None if self._abstained else max(1, int(finite[m - 1]) if m > 0 else 1)
        return self

    @property
    def abstained(self) -> bool:
        return self._abstained

    def member(self, q: SampledAnswers) -> set[str]:
        if self.alpha is None:
            raise RuntimeError("call fit() first")
        ranked = list(answer_scores(q, self.rank_by))
        return set(ranked if self.k is None else ranked[: self.k])

    def summary(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "k": self.k, "abstained": self.abstained}
