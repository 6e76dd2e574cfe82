"""Grounding the reasoner's answer strings to KG entities by normalized name."""

from __future__ import annotations

from kglightning.llm.grounding import AMBIGUOUS_ANSWER, UNMATCHED_ANSWER, ground_answers
from kglightning.llm.parsing import ParseStats, parse_answers


def test_equality_after_normalization_not_substring():
    g = ground_answers({"The Beatles!": 0.9, "Paris": 0.5}, ["Beatles", "Paris, Texas"])
    assert g.entities == {"Beatles": 0.9}
    assert g.unmatched == {"Paris": 0.5}
    assert g.issues == [UNMATCHED_ANSWER]


def test_highest_confidence_wins_and_none_is_kept():
    g = ground_answers({"spike": 0.2, "Spike.": 0.7, "SPIKE": None}, ["Spike"])
    assert g.entities == {"Spike": 0.7} and g.issues == []
    only_none = ground_answers({"Spike": None}, ["Spike"])
    assert only_none.entities == {"Spike": None}
    assert ground_answers({"Spike": None, "spike": 0.4}, ["Spike"]).entities == {"Spike": 0.4}


def test_ambiguous_and_id_mapping():
    g = ground_answers({"Atlanta": 0.8}, {"m.01": "Atlanta", "m.02": "atlanta", "m.03": "Boston"})
    assert g.entities == {"m.01": 0.8, "m.02": 0.8}
    assert g.issues == [AMBIGUOUS_ANSWER]


def test_answers_that_normalize_to_nothing_match_nothing():
    g = ground_answers({"the": 0.5, "...": 0.4}, ["The", "a"])
    assert g.entities == {} and set(g.unmatched) == {"the", "..."}
    assert g.issues == [UNMATCHED_ANSWER, UNMATCHED_ANSWER]


def test_parsed_answers_and_stats():
    parsed = parse_answers('{"Spike": 0.75, "Mars": 0.25}')
    stats = ParseStats()
    g = ground_answers(parsed, ["Spike", "Belle"], stats)
    assert g.entities == {"Spike": 0.75} and g.unmatched == {"Mars": 0.25}
    assert stats.as_dict() == {"total": 1, "clean": 0, UNMATCHED_ANSWER: 1}
