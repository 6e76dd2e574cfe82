"""Parsing the reasoner's ``{answer: confidence}`` output, stats over a run, and grounding to KG entities."""

from __future__ import annotations

import pytest

from kglightning.llm.grounding import AMBIGUOUS_ANSWER, UNMATCHED_ANSWER, ground_answers
from kglightning.llm.parsing import (
    CONFIDENCE_CLIPPED,
    DUPLICATE_ANSWER,
    EMPTY_ANSWER,
    EMPTY_OUTPUT,
    INVALID_ANSWER,
    INVALID_CONFIDENCE,
    MISSING_CONFIDENCE,
    NO_ANSWERS,
    NO_STRUCTURE,
    ParsedAnswers,
    ParseStats,
    parse_answers,
)

CLEAN = {"Atlanta": 0.8, "Memphis": 0.1}


@pytest.mark.parametrize(
    "text",
    [
        '{"Atlanta": 0.8, "Memphis": 0.1}',
        "{'Atlanta': 0.8, 'Memphis': 0.1}",
        "{Atlanta: 0.8, Memphis: 0.1}",  # the paper's own output format example has no quotes
        '```json\n{"Atlanta": 0.8, "Memphis": 0.1}\n```',
        "```\n{'Atlanta': 0.8, 'Memphis': 0.1}\n```",
        'Based on the paths, Atlanta is most likely.\n\n{"Atlanta": 0.8, "Memphis": 0.1}\nI hope this helps!',
        '{"Atlanta": "80%", "Memphis": "10 %"}',
        "{Atlanta: 80%, Memphis: 10%}",
        '{"Atlanta": "0.8", "Memphis": ".1"}',
        '{"Atlanta": 0.8, "Memphis": 0.1,}',
        "{\u201cAtlanta\u201d: 0.8, \u201cMemphis\u201d: 0.1}",
        '[{"answer": "Atlanta", "confidence": 0.8}, {"answer": "Memphis", "confidence": 0.1}]',
        '{"answer": "Atlanta", "confidence": 0.8}\n{"answer": "Memphis", "confidence": 0.1}',
        '[{"Atlanta": 0.8}, {"Memphis": 0.1}]',
        '[["Atlanta", 0.8], ["Memphis", 0.1]]',
        '{"answers": ["Atlanta", "Memphis"], "confidence": [0.8, 0.1]}',
        '{"Atlanta": {"confidence": 0.8}, "Memphis": {"probability": 0.1}}',
        "Atlanta [Confidence: 0.8]\nMemphis [Confidence: 0.1]",
        "- Atlanta: 0.8\n- Memphis: 0.1",
        "Let's think step by step. The format is {<answer_1>: <confidence_1>}. So: {Atlanta: 0.8, Memphis: 0.1}",
        '{"Atlanta": 0.8, "Memphis": 0.1} (based on path [1])',
    ],
)
def test_accepted_forms(text):
    result = parse_answers(text)
    assert result.answers == CLEAN
    assert result.issues == []


def test_answer_names_with_commas_and_colons():
    assert parse_answers("{Washington, D.C.: 0.7, Star Wars: Episode IV: 0.2}").answers == {
        "Washington, D.C.": 0.7,
        "Star Wars: Episode IV": 0.2,
    }
    assert parse_answers("{'Snoopy's brother': 0.4}").answers == {"Snoopy's brother": 0.4}
    assert parse_answers('{"1987": 0.5, "  New   York ": 0.2}').answers == {"1987": 0.5, "New York": 0.2}


@pytest.mark.parametrize(
    "text, answers, issues",
    [
        ('{"Spike": 85}', {"Spike": 1.0}, [CONFIDENCE_CLIPPED]),
        ('{"Spike": -0.2, "Belle": "150%"}', {"Spike": 0.0, "Belle": 1.0}, [CONFIDENCE_CLIPPED] * 2),
        ('{"Spike": null}', {"Spike": None}, [MISSING_CONFIDENCE]),
        ('["Spike", "Belle"]', {"Spike": None, "Belle": None}, [MISSING_CONFIDENCE] * 2),
        ("{Spike, Belle}", {"Spike": None, "Belle": None}, [MISSING_CONFIDENCE] * 2),
        (
            "{Memphis: 0.1, Atlanta: 0.8, Boston}",
            {"Memphis": 0.1, "Atlanta": 0.8, "Boston": None},
            [MISSING_CONFIDENCE],
        ),
        ('[{"answer": "Spike"}]', {"Spike": None}, [MISSING_CONFIDENCE]),
        ('{"Spike": "high"}', {"Spike": None}, [INVALID_CONFIDENCE]),
        ("{Spike: high, Belle: 0.2}", {"Spike": None, "Belle": 0.2}, [INVALID_CONFIDENCE]),
        ('{"Spike": true}', {"Spike": None}, [INVALID_CONFIDENCE]),
        ('{"Spike": NaN}', {"Spike": None}, [INVALID_CONFIDENCE]),
        ('{"Spike": [0.1, 0.2]}', {"Spike": None}, [INVALID_CONFIDENCE]),
        ('{"Spike": 0.4, "Spike": 0.7}', {"Spike": 0.7}, [DUPLICATE_ANSWER]),
        ('{"Spike": 0.4, " Spike ": null}', {"Spike": 0.4}, [MISSING_CONFIDENCE, DUPLICATE_ANSWER]),
        ('{"": 0.4, "Spike": 0.5}', {"Spike": 0.5}, [EMPTY_ANSWER]),
        ('[{"answer": null, "confidence": 0.3}]', {}, [EMPTY_ANSWER]),
        ('[{"answer": {"x": 1}, "confidence": 0.3}]', {}, [INVALID_ANSWER]),
        ("{}", {}, [NO_ANSWERS]),
        ("[]", {}, [NO_ANSWERS]),
        ("", {}, [EMPTY_OUTPUT]),
        ("   \n", {}, [EMPTY_OUTPUT]),
        (None, {}, [EMPTY_OUTPUT]),
        ("I don't know.", {}, [NO_STRUCTURE]),
        ("garbage {{{ ]] (", {}, [NO_STRUCTURE]),
        ("Answer: Atlanta\nConfidence: 0.8", {"Atlanta": 0.8}, []),
        ('{"Spike": 0.8', {"Spike": 0.8}, []),  # truncated before the closing brace
    ],
)
def test_departures_are_counted(text, answers, issues):
    result = parse_answers(text)
    assert result.answers == answers
    assert result.issues == issues
    assert result.abstained == (not answers)


def test_last_group_with_confidences_wins():
    text = 'Draft: {"Belle": 0.9}\nOn reflection the answer is:\n{"Spike": 0.6}\n[see note 1]'
    assert parse_answers(text).answers == {"Spike": 0.6}


def test_ranked():
    result = parse_answers('{"b": null, "c": 0.2, "a": 0.9, "d": 0.2}')
    assert result.ranked() == ["a", "c", "d", "b"]
    assert ParsedAnswers().ranked() == []


def test_stats_over_a_run():
    stats = ParseStats()
    for text in ['{"a": 0.5}', '{"a": 2}', "nonsense", '["a", "b"]', '{"a": 0.3}']:
        parse_answers(text, stats=stats)
    assert (stats.total, stats.clean) == (5, 2)
    assert stats.reasons == {CONFIDENCE_CLIPPED: 1, NO_STRUCTURE: 1, MISSING_CONFIDENCE: 2}
    assert stats.rate(MISSING_CONFIDENCE) == pytest.approx(0.4)
    assert ParseStats().rate(NO_STRUCTURE) == 0.0
    assert stats.as_dict("reasoner/")["reasoner/no_structure"] == 1
    assert "5 parsed, 2 clean" in str(stats)
    other = ParseStats()
    other.record([NO_STRUCTURE])
    assert (stats + other).count(NO_STRUCTURE) == 2 and stats.count(NO_STRUCTURE) == 1
    stats.merge(other)
    assert stats.total == 6


def test_ground_by_normalized_name():
    names = ["The Beatles", "United States of America", "Washington, D.C.", "Paris, Texas", "Mars"]
    parsed = parse_answers('{"beatles": 0.9, "united states of america": 0.6, "Washington DC": 0.5, "Paris": 0.4}')
    stats = ParseStats()
    grounded = ground_answers(parsed, names, stats=stats)
    assert grounded.entities == {"The Beatles": 0.9, "United States of America": 0.6, "Washington, D.C.": 0.5}
    assert grounded.unmatched == {"Paris": 0.4}  # exact normalized match, not RoG's substring test
    assert grounded.issues == [UNMATCHED_ANSWER]
    assert stats.count(UNMATCHED_ANSWER) == 1 and stats.total == 1


def test_ground_ids_ambiguity_merging_and_empty_names():
    entities = {"m.01": "Atlanta", "m.02": "atlanta", "m.03": "Memphis", "m.04": "The"}
    grounded = ground_answers({"ATLANTA": 0.7, "Memphis": None, "memphis.": 0.3, "the": 0.2}, entities)
    assert grounded.entities == {"m.01": 0.7, "m.02": 0.7, "m.03": 0.3}
    assert grounded.unmatched == {"the": 0.2}  # normalizes to "", which matches nothing
    assert grounded.issues == [AMBIGUOUS_ANSWER, UNMATCHED_ANSWER]
    assert ground_answers({}, ["x"]).entities == {}


@pytest.mark.parametrize(
    ("text", "answers"),
    [
        ("3.14 [Confidence: 0.9]", {"3.14": 0.9}),  # a number, not a list item "3." then "14"
        ("2.5 million: 0.4", {"2.5 million": 0.4}),
        ("1. Paris [Confidence: 0.8]\n2. Lyon [Confidence: 0.1]", {"Paris": 0.8, "Lyon": 0.1}),
        ("- Paris: 0.7", {"Paris": 0.7}),
    ],
)
def test_a_list_marker_needs_a_space_after_it(text, answers):
    assert parse_answers(text).answers == answers
