"""CLM (Quach et al. 2023, "Conformal Language Modeling"): sample, reject, stop, with Learn-Then-Test risk control.

For one question, CLM reads the sampled answers in order and builds a set ``C`` (Algorithm 1):

1. a sample with *quality* ``Q(y) < λ_q`` is rejected (low quality);
2. a sample too similar to an answer already in ``C`` (``max S(y, y') > λ_s``) is rejected (duplicate); the same
   answer twice is always a duplicate, since the set holds answers;
3. otherwise ``y`` joins ``C``; sampling *stops* as soon as the set confidence ``F(C) ≥ λ_f``, or when the ``m``
   samples are used up.

``F`` is ``"max"`` (the best quality in ``C``), ``"sum"`` (their sum) or ``"count"`` (``|C|``, CLM's first-K). The
loss of a question is 1 when ``C`` holds no admissible answer (a gold answer; ``coverage="all"``: not all of them).

Calibration is Learn-Then-Test over a grid ``Λ`` of ``(λ_q, λ_s, λ_f)``: on the *calibration* split each
configuration gets a binomial-tail p-value for ``H0: risk > α``; the configurations are tested in fixed sequence
(most conservative first: ordered by their empirical risk on a disjoint *selection* split, which is Pareto testing's
ordering), and the valid one with the smallest mean set size on the selection split is used. With probability at
least ``1 - δ`` over the calibration split, the chosen configuration's risk is at most ``α``. No valid
configuration means CLM *abstains*: every sampled answer is kept, and the result is flagged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kglightning.conformal.functional import ltt_select
from kglightning.conformal.sampling import Coverage, SampledAnswers, Similarity, exact_similarity, set_covers

__all__ = ["CLM", "CLMConfig", "clm_set"]

SetConfidence = Literal["max", "sum", "count"]


@dataclass(frozen=True)
class CLMConfig:
    """One configuration ``λ = (λ_q, λ_s, λ_f)``; ``math.inf`` for ``λ_s`` turns the similarity rejection off and
    for ``λ_f`` the stopping rule off."""

    quality: float
    similarity: float
    stop: float


def clm_set(
    q: SampledAnswers,
    config: CLMConfig,
    set_confidence: SetConfidence = "max",
    similarity: Similarity = exact_similarity,
    quality: Sequence[float] | None = None,
    memo: dict[tuple[int, int], float] | None = None,
) -> tuple[set[str], int]:
    """CLM's set for one question and the number of samples it read (see the module docstring); ``quality``
    overrides :meth:`SampledAnswers.sample_quality` and ``memo`` keeps ``similarity(samples[i], samples[j])`` by
    ``(i, j)``, so that a whole grid computes each pair it compares once (and no pair it never compares).

    Example:
        >>> q = SampledAnswers(("a", "b", "a", "c"), frozenset({"c"}), quality=(0.9, 0.2, 0.9, 0.6))
        >>> members, read = clm_set(q, CLMConfig(quality=0.5, similarity=math.inf, stop=math.inf))
        >>> sorted(members), read  # b rejected (quality), the second a a duplicate
        (['a', 'c'], 4)
        >>> members, read = clm_set(q, CLMConfig(quality=0.0, similarity=math.inf, stop=1.0), "sum")
        >>> sorted(members), read  # 0.9 + 0.2 >= 1: stop after two samples
        (['a', 'b'], 2)
    """
    quality = q.sample_quality() if quality is None else quality
    members: list[str] = []
    total = 0.0
    read = 0
    kept: list[int] = []  # sample index of each member
    for i, (y, qual) in enumerate(zip(q.samples, quality)):
        read += 1
        if not y or qual < config.quality or y in members:
            continue
        if config.similarity != math.inf:
            if memo is None:
                close = any(similarity(y, other) > config.similarity for other in members)
            else:
                close = any(_pair(memo, similarity, q.samples, i, j) > config.similarity for j in kept)
            if close:
                continue
        members.append(y)
        kept.append(i)
        total = max(total, qual) if set_confidence == "max" else total + qual
        score = float(len(members)) if set_confidence == "count" else total
        if score >= config.stop:
            break
    return set(members), read


def _pair(memo: dict[tuple[int, int], float], similarity: Similarity, samples: Sequence[str], i: int, j: int) -> float:
    """``similarity(samples[i], samples[j])``, computed on first use."""
    value = memo.get((i, j))
    if value is None:
        value = memo[(i, j)] = similarity(samples[i], samples[j])
    return value


def _quantile_grid(values: Sequence[float], k: int) -> list[float]:
    if not values:
        return [0.0]
    t = torch.tensor(values, dtype=torch.float64, device="cpu")  # answers' scores, not model tensors
    return sorted({float(v) for v in torch.quantile(t, torch.linspace(0, 1, k, dtype=torch.float64, device="cpu"))})


class CLM:
    """Conformal Language Modeling over sampled answers (see the module docstring).

    Args:
        delta: the FWER level of Learn-Then-Test (``1 - δ`` confidence in the risk bound).
        set_confidence: ``F``: ``"max"``, ``"sum"`` or ``"count"``.
        similarity: ``S(a, b)`` for the duplicate rule; default exact match (then only ``λ_s = ∞`` is gridded).
        similarity_grid: the ``λ_s`` values (with a similarity function); ``math.inf`` = no similarity rejection.
        grid_size: quality and stop thresholds: this many quantiles of the pooled sample qualities (plus no stop).
        coverage: ``"any"`` gold answer or ``"all"`` of them is admissible.
    """

    name = "clm"

    def __init__(
        self,
        delta: float = 0.1,
        set_confidence: SetConfidence = "max",
        similarity: Similarity | None = None,
        similarity_grid: Sequence[float] = (0.5, 0.7, 0.9, math.inf),
        grid_size: int = 8,
        coverage: Coverage = "any",
    ) -> None:
        if set_confidence not in ("max", "sum", "count"):
            raise ValueError(f"set_confidence must be 'max', 'sum' or 'count', got {set_confidence!r}")
        self.delta = delta
        self.set_confidence = set_confidence
        self.similarity = similarity
        self.similarity_grid = tuple(similarity_grid) if similarity is not None else (math.inf,)
        self.grid_size = grid_size
        self.coverage = coverage
        self.config: CLMConfig | None = None
        self.alpha: float | None = None
        self.grid: list[CLMConfig] = []
        self.n_valid = 0

    def make_grid(self, questions: Sequence[SampledAnswers]) -> list[CLMConfig]:
        """``Λ``: quality quantiles × similarity thresholds × stop thresholds (quantiles, counts or sums, and ∞)."""
        pooled = [x for q in questions for x in q.sample_quality()]
        qualities = [0.0, *_quantile_grid(pooled, self.grid_size)]
        if self.set_confidence == "count":
            m = max((q.m for q in questions), default=1)
            stops = sorted(
                {float(k) for k in torch.linspace(1, m, min(m, self.grid_size), device="cpu").round().tolist()}
            )
        elif self.set_confidence == "sum":
            stops = [s * k for s in _quantile_grid(pooled, self.grid_size) for k in (1, 2)]
        else:
            stops = _quantile_grid(pooled, self.grid_size)
        stops = sorted(set(stops)) + [math.inf]
        return [
            CLMConfig(a, b, c) for a, b, c in itertools.product(sorted(set(qualities)), self.similarity_grid, stops)
        ]

    def _outcomes(
        self, questions: Sequence[SampledAnswers], grid: Sequence[CLMConfig]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        sim = self.similarity or exact_similarity
        losses = torch.zeros(len(grid), len(questions), dtype=torch.float64, device="cpu")
        sizes = torch.zeros(len(grid), len(questions), dtype=torch.float64, device="cpu")
        qualities = [q.sample_quality() for q in questions]
        memos: list[dict[tuple[int, int], float]] = [{} for _ in questions]  # S(y, y') once per question and pair
        for j, config in enumerate(grid):
            for i, q in enumerate(questions):
                members, _ = clm_set(q, config, self.set_confidence, sim, qualities[i], memos[i])
                losses[j, i] = 0.0 if set_covers(members, q.gold, self.coverage) else 1.0
                sizes[j, i] = len(members)
        return losses, sizes

    def fit(self, calibration: Sequence[SampledAnswers], selection: Sequence[SampledAnswers], alpha: float) -> CLM:
        """Certify configurations on ``calibration`` and pick one with ``selection`` (two disjoint splits)."""
        if not calibration or not selection:
            raise ValueError("CLM needs a non-empty calibration split and a non-empty selection split")
        self.grid = self.make_grid(selection)
        cal_losses, _ = self._outcomes(calibration, self.grid)
        sel_losses, sel_sizes = self._outcomes(selection, self.grid)
        order = torch.argsort(sel_losses.mean(dim=1), stable=True)  # lowest selection risk first
        result = ltt_select(cal_losses, sel_sizes, alpha, self.delta, "fixed_sequence", "binomial", order)
        self.alpha, self.n_valid = alpha, int(result.valid.sum())
        self.config = None if result.index is None else self.grid[result.index]
        return self

    @property
    def abstained(self) -> bool:
        return self.alpha is not None and self.config is None

    def member(self, q: SampledAnswers) -> set[str]:
        """The question's set under the chosen configuration; every sampled answer when CLM abstained."""
        if self.alpha is None:
            raise RuntimeError("call fit() first")
        if self.config is None:
            return {s for s in q.samples if s}
        return clm_set(q, self.config, self.set_confidence, self.similarity or exact_similarity)[0]

    def summary(self) -> dict[str, Any]:
        config = None
        if self.config is not None:  # null for ∞: strict JSON has no Infinity
            config = {k: (None if v == math.inf else v) for k, v in vars(self.config).items()}
        return {"alpha": self.alpha, "delta": self.delta, "config": config, "abstained": self.abstained,
                "valid_configs": self.n_valid, "grid_size": len(self.grid)}  # fmt: skip
