"""LoFreeCP (Su et al. 2024, "API Is Enough"): logit-free conformal prediction sets from sampled answers.

Each distinct sampled answer ``y`` of a question gets the non-conformity

    N(y) = -F(y) + λ1 · NE - λ2 · SS(y, ŷ)

* ``F(y)``: the share of the ``m`` samples that gave ``y`` (coarse-grained);
* ``NE``: the normalised entropy of the question's sample distribution, ``H / log m`` in ``[0, 1]`` (a no-answer
  sample counts as its own outcome; ``m = 1`` gives 0), the same for all its answers (prompt-wise consistency);
* ``SS(y, ŷ)``: the similarity of ``y`` to the most frequent answer ``ŷ`` (response-wise), left out for ``ŷ``
  itself (as in the authors' code, which skips it for the reference answer).

An answer that was never sampled has ``N = +∞``. A calibration question's score is the smallest ``N`` over its gold
answers (``coverage="any"``) or the largest (``"all"``); the threshold is the exact split-conformal quantile (the
``⌈(n+1)(1-α)⌉``-th smallest), and the set holds every sampled answer with ``N ≤ q̂``. When that rank exceeds the
finite scores, ``q̂ = +∞``: every sampled answer is kept and the result is flagged ``abstained`` (its coverage is
then only what sampling found).

The weights ``(λ1, λ2)`` are chosen on a *separate* tuning split (smallest mean set size there, with the threshold
fitted on that split too), so the calibration split that sets ``q̂`` stays exchangeable with the test questions.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

from kglightning.conformal.sampling import (
    Coverage,
    SampledAnswers,
    Similarity,
    SplitConformalSets,
    evaluate_sets,
    exact_similarity,
    gold_value,
)

__all__ = ["LoFreeCP", "normalized_entropy"]


def normalized_entropy(q: SampledAnswers) -> float:
    """Entropy of the sample distribution (no-answer samples as one outcome) over ``log m``; 0 when ``m = 1``.

    Example:
        >>> round(normalized_entropy(SampledAnswers(("a", "a", "b", "c"), frozenset())), 6)  # 1.5 bits / 2 bits
        0.75
        >>> normalized_entropy(SampledAnswers(("a", "a"), frozenset()))
        0.0
    """
    if q.m < 2:
        return 0.0
    counts = [c / q.m for c in q._counts.values()]
    empty = sum(1 for s in q.samples if not s) / q.m
    probs = counts + ([empty] if empty else [])
    return max(0.0, -sum(p * math.log(p) for p in probs) / math.log(q.m))


class LoFreeCP(SplitConformalSets):
    """Split conformal prediction on LoFreeCP's non-conformity (see the module docstring).

    Args:
        lambda_entropy: ``λ1``, the weight of the normalised entropy.
        lambda_similarity: ``λ2``, the weight of the similarity to the most frequent answer.
        similarity: ``(a, b) -> [0, 1]``, e.g. the cosine of sentence embeddings; default exact match (then the
            similarity term is 0 for every answer but ``ŷ``, where it is left out anyway).
        coverage: ``"any"`` gold answer or ``"all"`` of them.
    """

    name = "lofree_cp"

    def __init__(
        self,
        lambda_entropy: float = 1.0,
        lambda_similarity: float = 1.0,
        similarity: Similarity | None = None,
        coverage: Coverage = "any",
    ) -> None:
        if lambda_entropy < 0 or lambda_similarity < 0:
            raise ValueError(f"the weights must be >= 0, got {lambda_entropy}, {lambda_similarity}")
        self.lambda_entropy = lambda_entropy
        self.lambda_similarity = lambda_similarity
        self.similarity = similarity or exact_similarity
        self.coverage = coverage
        self.qhat: float | None = None
        self.alpha: float | None = None

    def scores(self, q: SampledAnswers) -> dict[str, float]:
        """``N(y)`` of each distinct sampled answer, most frequent first.

        Example:
            >>> LoFreeCP(1.0, 0.0).scores(SampledAnswers(("a", "a", "b", "c"), frozenset()))
            {'a': 0.25, 'b': 0.5, 'c': 0.5}
        """
        freq = q.frequencies()
        if not freq:
            return {}
        top = next(iter(freq))
        ne = self.lambda_entropy * normalized_entropy(q) if self.lambda_entropy else 0.0
        out = {}
        for y, f in freq.items():
            ss = 0.0 if y == top or not self.lambda_similarity else self.lambda_similarity * self.similarity(y, top)
            out[y] = -f + ne - ss
        return out

    def nonconformity(self, q: SampledAnswers) -> dict[str, float]:
        return self.scores(q)

    def calibration_score(self, q: SampledAnswers) -> float:
        """The question's score: ``N`` of its best (``any``) or worst (``all``) gold answer; ``+inf`` if unsampled."""
        return gold_value(self.scores(q), q, self.coverage)

    def summary(self) -> dict[str, Any]:
        return super().summary() | {"lambda_entropy": self.lambda_entropy, "lambda_similarity": self.lambda_similarity}

    @classmethod
    def tune(
        cls,
        tuning: Sequence[SampledAnswers],
        alpha: float,
        lambdas_entropy: Sequence[float] = (0.0, 0.5, 1.0, 1.5, 2.0),
        lambdas_similarity: Sequence[float] = (0.0, 0.5, 1.0, 1.5, 2.0),
        similarity: Similarity | None = None,
        coverage: Coverage = "any",
    ) -> LoFreeCP:
        """The weights with the smallest mean set size on ``tuning`` (threshold fitted there too; ties: the first
        pair in grid order). Fit the returned, unfitted instance on a *different* calibration split.
        """
        best: tuple[float, LoFreeCP] | None = None
        for l1, l2 in itertools.product(lambdas_entropy, lambdas_similarity):
            cp = cls(l1, l2, similarity, coverage).fit(tuning, alpha)
            apss = evaluate_sets(tuning, [cp.member(q) for q in tuning], coverage)["apss"]
            if best is None or apss < best[0]:
                best = (apss, cp)
        if best is None:
            raise ValueError("empty weight grid")
        return cls(best[1].lambda_entropy, best[1].lambda_similarity, similarity, coverage)
