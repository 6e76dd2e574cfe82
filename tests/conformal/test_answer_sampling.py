"""AnswerSampler: m seeded samples per question from a proposer, first name per sample, quality from log-probs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from kglightning.conformal.answer_sampling import AnswerSampler
from kglightning.data.proposer import AnswerProposer
from kglightning.data.records import KGQARecord
from kglightning.llm.backends.base import GenerationParams


class SeededProposer(AnswerProposer):
    """Answers from a table keyed by (question id, seed); log-probs when asked."""

    def __init__(self, table: dict[tuple[str, int], list[str]]) -> None:
        self.table = table
        self.generation = GenerationParams(max_new_tokens=8)
        self.seen: list[GenerationParams] = []

    @property
    def cache_key(self) -> str:
        return "seeded"

    def propose(self, records):
        self.seen.append(self.generation)
        out = []
        for r in records:
            names = self.table[(r.id, self.generation.seed)]
            info = {"logprob": -0.5 * len(names), "tokens": 2} if self.generation.logprobs else {}
            out.append(replace(r, prediction=names, extra=dict(r.extra, kaping=info)))
        return out


def _record(qid: str) -> KGQARecord:
    return KGQARecord(id=qid, question="q?", answer=["A"], q_entity=["X"], a_entity=["A"], graph=[("X", "r", "A")])


def test_samples_quality_and_restored_generation():
    table = {("q1", 1): ["A", "B"], ("q1", 2): [], ("q1", 3): ["B"]}
    proposer = SeededProposer(table)
    sampler = AnswerSampler(proposer, samples=3, temperature=0.7)
    (q,) = sampler.sample([_record("q1")])
    assert q.samples == ("A", "", "B") and q.gold == frozenset({"A"}) and q.id == "q1"
    assert q.quality == pytest.approx((math.exp(-1.0 / 2), 0.0, math.exp(-0.5 / 2)))
    assert [(g.seed, g.temperature, g.logprobs) for g in proposer.seen] == [
        (1, 0.7, True),
        (2, 0.7, True),
        (3, 0.7, True),
    ]
    assert proposer.generation == GenerationParams(max_new_tokens=8)  # restored
    assert sampler.counts == {"questions": 1, "samples": 3, "no_answer": 1}
    (f,) = AnswerSampler(proposer, samples=3, quality="frequency").sample([_record("q1")])
    assert f.quality is None and f.sample_quality() == [1 / 3, 0.0, 1 / 3]


def test_missing_logprobs_and_bad_settings_are_clear_errors():
    class NoLogprobs(SeededProposer):
        def propose(self, records):
            return [replace(r, prediction=["A"]) for r in records]

    with pytest.raises(ValueError, match="no log-probability.*quality: frequency"):
        AnswerSampler(NoLogprobs({}), samples=2).sample([_record("q1")])
    with pytest.raises(ValueError, match="samples >= 1"):
        AnswerSampler(SeededProposer({}), samples=0)
    with pytest.raises(TypeError, match="GenerationParams"):
        AnswerSampler(object(), samples=2)  # type: ignore[arg-type]
