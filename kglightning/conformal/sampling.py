"""Sampled LLM answers of one question: what the sampling-based conformal baselines (CLM, LoFreeCP) calibrate on.

An LLM is asked the same question ``m`` times (temperature > 0); each sample is one answer string, already
normalised (e.g. a KG node name, or SQuAD-normalised text), ``""`` for a sample that gave no answer. A sample may
carry a *quality* (higher = better): the LLM's sequence probability for logit-based methods, or nothing, in which
case a method falls back to the answer's sample frequency.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from kglightning.conformal.functional import conformal_quantile

Coverage = Literal["any", "all"]
Similarity = Callable[[str, str], float]
"""``(a, b) -> similarity`` of two answers, ``1`` for identical ones (e.g. the cosine of their embeddings)."""

__all__ = ["Coverage", "SampledAnswers", "Similarity", "exact_similarity", "set_covers"]


def exact_similarity(a: str, b: str) -> float:
    """1 for the same answer, else 0 (what similarity means without an encoder).

    Example:
        >>> exact_similarity("Paris", "Paris"), exact_similarity("Paris", "Lyon")
        (1.0, 0.0)
    """
    return float(a == b)


@dataclass(frozen=True)
class SampledAnswers:
    """The ``m`` sampled answers of one question and its gold answers.

    Args:
        samples: the answers in sampling order (``""`` = the sample gave no answer; it is never a set member).
        gold: the gold answers, normalised like the samples.
        quality: one score per sample, higher = better (e.g. the sequence probability); ``None``: not available.
        id: the question id (for reports).

    Example:
        >>> q = SampledAnswers(("Paris", "Lyon", "Paris", ""), gold=frozenset({"Paris"}))
        >>> q.frequencies()
        {'Paris': 0.5, 'Lyon': 0.25}
        >>> q.sample_quality()  # no quality given: the answer's frequency
        [0.5, 0.25, 0.5, 0.0]
    """

    samples: tuple[str, ...]
    gold: frozenset[str]
    quality: tuple[float, ...] | None = None
    id: str = ""
    _counts: Counter[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.samples, str):
            raise TypeError("samples must be a sequence of answers, not one string")
        if not self.samples:
            raise ValueError(f"question {self.id!r}: no samples")
        if self.quality is not None and len(self.quality) != len(self.samples):
            raise ValueError(
                f"question {self.id!r}: {len(self.quality)} quality scores for {len(self.samples)} samples"
            )
        object.__setattr__(self, "_counts", Counter(s for s in self.samples if s))

    @property
    def m(self) -> int:
        """The number of samples."""
        return len(self.samples)

    def frequencies(self) -> dict[str, float]:
        """Each distinct answer's share of the ``m`` samples, most frequent first (ties: first sampled first)."""
        return {a: c / self.m for a, c in self._counts.most_common()}

    def sample_quality(self) -> list[float]:
        """The quality of each sample: the given one, else the sampled answer's frequency (0 for no answer)."""
        if self.quality is not None:
            return [float(x) for x in self.quality]
        return [self._counts[s] / self.m if s else 0.0 for s in self.samples]


def set_covers(members: set[str] | frozenset[str], gold: frozenset[str], coverage: Coverage = "any") -> bool:
    """Whether a prediction set covers the gold answers: one of them (``"any"``) or all (``"all"``); never when
    there is no gold answer.

    Example:
        >>> set_covers({"Paris"}, frozenset({"Paris", "Lyon"})), set_covers({"Paris"}, frozenset({"Paris", "Lyon"}), "all")
        (True, False)
    """
    if not gold:
        return False
    return bool(members & gold) if coverage == "any" else gold <= members


def evaluate_sets(
    questions: Sequence[SampledAnswers], sets: Sequence[set[str]], coverage: Coverage = "any"
) -> dict[str, float]:
    """Empirical coverage (ECR) and average set size (APSS) over questions.

    Example:
        >>> qs = [SampledAnswers(("a",), frozenset({"a"})), SampledAnswers(("b",), frozenset({"c"}))]
        >>> evaluate_sets(qs, [{"a"}, {"b", "d"}])
        {'ecr': 0.5, 'apss': 1.5}
    """
    if len(questions) != len(sets):
        raise ValueError(f"{len(sets)} sets for {len(questions)} questions")
    n = max(len(questions), 1)
    return {
        "ecr": sum(set_covers(s, q.gold, coverage) for q, s in zip(questions, sets)) / n,
        "apss": sum(len(s) for s in sets) / n,
    }


def gold_value(values: dict[str, float], q: SampledAnswers, coverage: Coverage = "any") -> float:
    """The gold answers' smallest value (``"any"``) or largest (``"all"``); ``+inf`` when one needed is missing.

    Example:
        >>> q = SampledAnswers(("a",), frozenset({"a", "b"}))
        >>> gold_value({"a": 0.2, "b": 0.5}, q), gold_value({"a": 0.2}, q, "all")
        (0.2, inf)
    """
    gold = [values.get(g, math.inf) for g in q.gold]
    if not gold:
        return math.inf
    return min(gold) if coverage == "any" else max(gold)


class SplitConformalSets(ABC):
    """Split conformal prediction over sampled answers, for any non-conformity of the distinct sampled answers.

    A subclass defines :meth:`nonconformity` (lower = more conforming; answers never sampled have none). A calibration
    question's score is its gold answers' (:func:`gold_value`: ``+inf`` when unsampled); ``q̂`` is the exact
    ``⌈(n+1)(1-α)⌉``-th smallest, ``+inf`` when that rank is beyond the finite scores: the set is then every sampled
    answer and :attr:`abstained` is true.
    """

    coverage: Coverage = "any"
    qhat: float | None = None
    alpha: float | None = None

    @abstractmethod
    def nonconformity(self, q: SampledAnswers) -> dict[str, float]:
        """The non-conformity of each distinct sampled answer."""

    def fit(self, calibration: Sequence[SampledAnswers], alpha: float) -> SplitConformalSets:
        """Set ``q̂`` from a calibration split."""
        cal = [gold_value(self.nonconformity(q), q, self.coverage) for q in calibration]
        self.qhat, self.alpha = (
            float(conformal_quantile(torch.tensor(cal, dtype=torch.float64, device="cpu"), alpha)),
            alpha,
        )
        return self

    @property
    def abstained(self) -> bool:
        return self.qhat == math.inf

    def member(self, q: SampledAnswers) -> set[str]:
        """The question's set: its sampled answers whose non-conformity is at most ``q̂``."""
        if self.qhat is None:
            raise RuntimeError("call fit() first")
        return {y for y, s in self.nonconformity(q).items() if s <= self.qhat}

    def summary(self) -> dict[str, Any]:
        return {"alpha": self.alpha, "qhat": None if self.abstained else self.qhat, "abstained": self.abstained}


__all__ += ["SplitConformalSets", "evaluate_sets", "gold_value"]
