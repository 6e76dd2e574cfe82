"""SGIC's training-set construction (§3.3) on a scripted backend whose every answer is known."""

from __future__ import annotations

import pytest

from kglightning.data.sources.passages import PassageExample
from kglightning.llm.sgic_prompt import SGICPrompt
from kglightning.llm.sgic_rounds import SelfCalibration

EXAMPLES = [
    PassageExample("fr", "capital of France?", ["Paris"], ["France capital Paris", "France borders Spain"]),
    PassageExample("jp", "capital of Japan?", ["Tokyo"], ["Japan capital Tokyo"]),
    PassageExample("pe", "capital of Peru?", ["Lima"], ["Peru capital Lima"]),
]


def test_training_records_keep_calibrate_and_drop(scripted_sgic):
    engine = SelfCalibration(scripted_sgic(), rounds=3, prompt=SGICPrompt(instruction="Answer."))
    records, counts = engine.training_records(EXAMPLES, mean=0.6)
    assert counts == {"kept": 1, "calibrated": 1, "dropped": 1}  # Peru: "Tokyo" every round, never right
    by_id = {r["id"]: r for r in records}
    fr = by_id["fr"]
    # France: Lyon (round 0, wrong) -> Paris (round 1, right): the input is the round-1 prompt, Lyon as Round 1
    assert fr["kind"] == "calibrated" and fr["correct_round"] == 1 and fr["target"] == "Paris"
    assert fr["messages"][-1]["content"].endswith("Round 1: Lyon (Uncertainty Score: 75)\nAnswer:")
    assert [h["answer"] for h in fr["history"]] == ["Lyon", "Paris"]  # no round after the correct one
    # Japan: right at round 0 -> kept, the substitution: its own answer is Round 1 and the target
    jp = by_id["jp"]
    assert jp["kind"] == "kept" and jp["target"] == "Tokyo" and jp["correct_round"] == 0
    assert jp["messages"][-1]["content"].endswith("Round 1: Tokyo (Uncertainty Score: 12)\nAnswer:")
    assert engine.cost["build"]["prompt_tokens"] > 0


def test_gold_target_and_argument_checks(scripted_sgic):
    engine = SelfCalibration(scripted_sgic(), rounds=1)
    records, _ = engine.training_records(EXAMPLES[:1], mean=0.6, target="gold")
    assert records[0]["target"] == "Paris"
    with pytest.raises(ValueError, match="rounds"):
        SelfCalibration(scripted_sgic(), rounds=0)


def test_correct_if_hit_accepts_sentences_that_contain_the_answer(scripted_sgic):
    em, hit = SelfCalibration(scripted_sgic(), rounds=1), SelfCalibration(scripted_sgic(), rounds=1, correct_if="hit")
    assert not em.is_correct("It is Paris.", ["Paris"]) and hit.is_correct("It is Paris.", ["Paris"])
    assert not hit.is_correct("Parisian food", ["Paris"]) and em.is_correct("the Paris", ["Paris"])
    records, counts = hit.training_records(EXAMPLES, mean=0.6)
    assert counts == {"kept": 1, "calibrated": 1, "dropped": 1}  # single-word answers: the same outcome as EM
    with pytest.raises(ValueError, match="correct_if"):
        SelfCalibration(scripted_sgic(), correct_if="f1")
