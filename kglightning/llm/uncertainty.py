"""SGIC's uncertainty scores from token probabilities (SGIC §3.1, Eq. 1-3).

An :class:`UncertaintyEstimator` turns one greedy :class:`~kglightning.llm.backends.Generation` (with its token
log-probabilities) into a *confidence* in ``[0, 1]``. The default, :class:`MaxProbProduct`, is the paper's Eq. 1: the
product of the highest probability at each generated token. Under greedy decoding the generated token *is* the most
probable one, so this is ``exp(sum(token_logprobs))``. The paper notes that any better estimator may replace it:
subclass :class:`UncertaintyEstimator` and name it by ``class_path`` (:class:`GeometricMeanProb` is a
length-normalised alternative).

The confidences become 0-100 *uncertainty* scores (higher = less certain), the numbers the prompts show:

* :func:`answer_uncertainty` (Eq. 2): the confidence is compared with the mean confidence ``s̄`` of the split's
  answers, ``ŝ = (s - s̄) / s̄`` below the mean and ``(s - s̄) / (1 - s̄)`` above it, so ``ŝ ∈ [-1, 1]`` and the mean
  maps to 0; the uncertainty is ``100 · (0.5 - 0.5 · ŝ)``: 50 at the mean, 0 for a certain answer, 100 for a
  zero-probability one. (This equals Eq. 2 applied to ``1 - s``, the uncertainty, with mean ``1 - s̄``.)
* :func:`document_uncertainty` (Eq. 3): for each document, ``1 - s`` of the answer generated from the question and
  that document alone, min-max normalised over the question's documents to 0-100 (all equal: all 0).

Example:
    >>> from kglightning.llm.backends.base import Generation
    >>> gen = Generation(text="Paris", token_logprobs=[-0.1, -0.2], tokens=["Par", "is"])
    >>> round(MaxProbProduct()(gen, backend="demo"), 4)
    0.7408
    >>> answer_uncertainty(0.7408, mean=0.5), answer_uncertainty(0.25, mean=0.5)
    (25.92, 75.0)
    >>> document_uncertainty([0.9, 0.5, 0.1])
    [0.0, 50.0, 100.0]
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence

from kglightning.llm.backends.base import Generation

__all__ = [
    "GeometricMeanProb",
    "MaxProbProduct",
    "MissingLogprobsError",
    "UncertaintyEstimator",
    "answer_uncertainty",
    "document_uncertainty",
]


class MissingLogprobsError(RuntimeError):
    """A backend returned a generation without token log-probabilities, which SGIC's scores need."""


class UncertaintyEstimator(abc.ABC):
    """Maps one generation to a confidence in ``[0, 1]`` (higher = more certain).

    Subclasses implement :meth:`confidence` on the token log-probabilities. Calling the estimator checks that they
    are present and raises :class:`MissingLogprobsError` naming the backend otherwise.
    """

    @abc.abstractmethod
    def confidence(self, logprobs: Sequence[float]) -> float:
        """The confidence in ``[0, 1]`` from the (non-empty) token log-probabilities of one generation."""

    def __call__(self, gen: Generation, backend: str = "the backend") -> float:
        if gen.token_logprobs is None:
            raise MissingLogprobsError(
                f"{backend} returned no token log-probabilities; SGIC's uncertainty scores need them (a local HF model "
                "always has them; an OpenAI-compatible server must support `logprobs`, as vLLM does)"
            )
        if not gen.token_logprobs:  # nothing generated: no evidence of certainty
            return 0.0
        return min(1.0, max(0.0, self.confidence(gen.token_logprobs)))


class MaxProbProduct(UncertaintyEstimator):
    """SGIC's Eq. 1: the product of the (greedy, so maximal) token probabilities.

    >>> MaxProbProduct().confidence([math.log(0.5), math.log(0.5)])
    0.25
    """

    def confidence(self, logprobs: Sequence[float]) -> float:
        return math.exp(sum(logprobs))


class GeometricMeanProb(UncertaintyEstimator):
    """The geometric mean of the token probabilities: Eq. 1 normalised for length (long answers are not penalised).

    >>> GeometricMeanProb().confidence([math.log(0.5), math.log(0.5)])
    0.5
    """

    def confidence(self, logprobs: Sequence[float]) -> float:
        return math.exp(sum(logprobs) / len(logprobs))


def answer_uncertainty(confidence: float, mean: float) -> float:
    """SGIC's Eq. 2 as a 0-100 uncertainty, rounded to 2 decimals: 50 at the split mean ``mean`` of confidences.

    >>> answer_uncertainty(1.0, 0.4), answer_uncertainty(0.4, 0.4), answer_uncertainty(0.0, 0.4)
    (0.0, 50.0, 100.0)
    """
    if not 0.0 <= confidence <= 1.0:
        raise ValueError(f"confidence must be in [0, 1], got {confidence}")
    if not 0.0 < mean < 1.0:
        raise ValueError(f"the mean confidence must be in (0, 1), got {mean}")
    s_hat = (confidence - mean) / mean if confidence < mean else (confidence - mean) / (1.0 - mean)
    return round(100.0 * (0.5 - 0.5 * s_hat), 2)


def document_uncertainty(confidences: Sequence[float]) -> list[float]:
    """SGIC's Eq. 3: ``1 - confidence`` per document, min-max normalised over the documents to 0-100 (2 decimals).

    >>> document_uncertainty([0.2, 0.2]), document_uncertainty([0.3])
    ([0.0, 0.0], [0.0])
    """
    raw = [1.0 - c for c in confidences]
    if not raw:
        return []
    lo, hi = min(raw), max(raw)
    if hi - lo <= 1e-12:
        return [0.0 for _ in raw]
    return [round(100.0 * (r - lo) / (hi - lo), 2) for r in raw]
