"""Sampled LLM answers for the sampling-based conformal baselines (CLM, LoFreeCP), from any answer proposer.

:class:`AnswerSampler` re-runs an answerer (e.g. :class:`~kglightning.llm.kaping.KAPINGAnswerer`, whose answers are
constrained to the question's node names) ``samples`` times at ``temperature``, with seeds ``seed + 1 ... seed +
samples``, and keeps the *first* name of each answer as that sample's answer (``""`` when the answer was
``unknown``). Gold answers are the record's answer entities (``a_entity``), as in UAG's coverage.

A sample's quality is the answer's length-normalised probability ``exp(mean token log-probability)`` under the
model, over the answer's own tokens (the line it was read from, as the answerer reports them in
``extra["kaping"]``; not the whole multi-line generation) (``quality="logprob"``, what CLM's logit-based quality needs; the backend must return log-probabilities), or
nothing (``quality="frequency"``: the methods then use the answer's sample frequency, logit-free as LoFreeCP is).
Every generation goes through the answerer's backend cache, so an interrupted run resumes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from kglightning.conformal.sampling import SampledAnswers
from kglightning.data.proposer import AnswerProposer
from kglightning.data.records import KGQARecord
from kglightning.llm.backends.base import GenerationParams

__all__ = ["AnswerSampler"]


class AnswerSampler:
    """``samples`` answers per question from ``answerer`` (see the module docstring).

    Args:
        answerer: a proposer with a ``generation`` (:class:`~kglightning.llm.backends.base.GenerationParams`)
            attribute that writes ``extra['kaping']['logprob']`` when asked for log-probabilities (KAPING does).
        samples: ``m``, answers per question.
        temperature: sampling temperature (> 0).
        quality: ``"logprob"`` or ``"frequency"``.
    """

    def __init__(
        self,
        answerer: AnswerProposer,
        samples: int = 10,
        temperature: float = 1.0,
        quality: Literal["logprob", "frequency"] = "logprob",
    ) -> None:
        if samples < 1 or temperature <= 0:
            raise ValueError(f"need samples >= 1 and temperature > 0, got {samples}, {temperature}")
        if quality not in ("logprob", "frequency"):
            raise ValueError(f"quality must be 'logprob' or 'frequency', got {quality!r}")
        if not isinstance(getattr(answerer, "generation", None), GenerationParams):
            raise TypeError(f"{type(answerer).__name__} has no GenerationParams 'generation' to sample with")
        self.answerer = answerer
        self.samples = samples
        self.temperature = temperature
        self.quality = quality
        self.counts = {"questions": 0, "samples": 0, "no_answer": 0}

    def sample(self, records: Sequence[KGQARecord]) -> list[SampledAnswers]:
        """One :class:`~kglightning.conformal.sampling.SampledAnswers` per record, in order."""
        base: GenerationParams = self.answerer.generation  # type: ignore[attr-defined]
        answers: list[list[str]] = [[] for _ in records]
        quality: list[list[float]] = [[] for _ in records]
        try:
            for k in range(self.samples):
                params = replace(base, temperature=self.temperature, seed=base.seed + 1 + k)
                self.answerer.generation = replace(params, logprobs=self.quality == "logprob")  # type: ignore[attr-defined]
                proposed = self.answerer.propose([replace(r, prediction=None) for r in records])
                for i, r in enumerate(proposed):
                    first = (r.prediction or [""])[0]
                    answers[i].append(first)
                    self.counts["samples"] += 1
                    self.counts["no_answer"] += not first
                    info = r.extra.get("kaping", {})
                    if self.quality == "logprob":
                        if "logprob" not in info:
                            raise ValueError(
                                f"question {r.id!r}: {type(self.answerer).__name__} returned no log-probability "
                                "(its backend must support GenerationParams.logprobs); use quality: frequency"
                            )
                        n = max(int(info.get("tokens", 1)), 1)
                        quality[i].append(math.exp(info["logprob"] / n) if first else 0.0)
        finally:
            self.answerer.generation = base  # type: ignore[attr-defined]
        self.counts["questions"] += len(records)
        return [
            SampledAnswers(
                tuple(a),
                frozenset(r.a_entity),
                tuple(q) if self.quality == "logprob" else None,
                id=r.id,
            )
            for r, a, q in zip(records, answers, quality)
        ]
