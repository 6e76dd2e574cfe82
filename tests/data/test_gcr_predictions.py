"""GCR's beams (reasoning path + answer) as prediction entries with the paths they cite."""

from __future__ import annotations

import pytest

from kglightning.data.records import RecordError
from kglightning.data.sources.gcr_predictions import gcr_answers, is_gcr_row, parse_beam, record_from_gcr
from kglightning.data.sources.prediction_lines import ImportStats


def beam(path: str, answer: str) -> str:
    return f"# Reasoning Path:\n{path}\n# Answer:\n{answer}"


POLK = "James K. Polk -> government.politician.positions -> m.04j60kc -> government.position.title -> Governor"


def test_a_beam_is_its_path_lines_and_its_answer_lines():
    assert parse_beam(beam(POLK, "Governor")) == ([POLK], ["Governor"])
    assert parse_beam(beam(f"<PATH>{POLK}</PATH>", "Governor\n\n Lawyer ")) == ([POLK], ["Governor", "Lawyer"])
    assert parse_beam("# Answer:\nGovernor") == ([], ["Governor"])
    assert parse_beam(f"# Reasoning Path:\n{POLK}\n") is None
    assert parse_beam(f"# Reasoning Path:\n{POLK}\n# Answer:\n  \n") is None


def test_beams_become_aligned_answers_and_cited_paths_with_every_drop_counted():
    stats = ImportStats()
    beams = [
        beam(POLK, "Governor"),
        beam(POLK, "Governor"),  # a repeat is a vote: kept
        beam("James K. Polk -> people.person.profession", "Lawyer"),  # even number of parts: kept out, counted
        beam("James K. Polk -> people.person.profession -> Lawyer", "Lawyer\nFarmer"),  # two answers, one path
        f"# Reasoning Path:\n{POLK}",  # no answer: skipped, counted
        7,  # not a string: dropped, counted
    ]
    prediction, cited = gcr_answers(beams, stats)
    polk = POLK.split(" -> ")
    profession = ["James K. Polk", "people.person.profession", "Lawyer"]
    assert prediction == ["Governor", "Governor", "Lawyer", "Lawyer", "Farmer"]
    assert cited == [[polk], [polk], [], [profession], [profession]]
    assert cited[3] is not cited[4]  # each answer has its own list
    assert (stats.beams, stats.beams_without_answer, stats.non_string_items) == (5, 1, 1)
    assert (stats.cited_paths, stats.unparsed_paths, stats.answers) == (3, 1, 5)
    assert stats.unparsed_examples == ["James K. Polk -> people.person.profession"]


def test_a_line_on_its_own_takes_its_graph_from_the_cited_paths():
    row = {"id": 5, "question": "what did polk do", "ground_truth": ["Governor", "President"],
           "prediction": [beam(POLK, "Governor"), beam(POLK, "Governor"), beam("X -> r", "Mars")], "extra": 1}  # fmt: skip
    assert is_gcr_row(row) and not is_gcr_row({"prediction": ["Governor"]}) and not is_gcr_row({"prediction": "a"})
    rec = record_from_gcr(row, source="p.jsonl", line=2)
    assert rec.id == "5" and rec.prediction == ["Governor", "Governor", "Mars"]
    assert rec.prediction_paths == [[POLK.split(" -> ")], [POLK.split(" -> ")], []]
    assert rec.graph == [
        ("James K. Polk", "government.politician.positions", "m.04j60kc"),
        ("m.04j60kc", "government.position.title", "Governor"),
    ]
    assert (rec.q_entity, rec.a_entity, rec.answer) == (["James K. Polk"], ["Governor"], ["Governor", "President"])
    with pytest.raises(RecordError) as err:
        record_from_gcr({**row, "ground_truth": None}, source="p.jsonl", line=2)
    assert (err.value.line, err.value.field) == (2, "ground_truth")


def test_a_repeated_answer_header_is_not_an_answer():
    """Issue 57: GCR's beams for WebQSP test questions 60 and 699 repeat ``# Answer:``; the import took the second
    header as the literal answer ``'# Answer:'``, then scored as a hallucination."""
    assert parse_beam(f"# Reasoning Path:\n{POLK}\n# Answer:\n# Answer:\nGovernor") == ([POLK], ["Governor"])
    assert parse_beam(f"# Reasoning Path:\n{POLK}\n# Answer:\n# Answer:\n") is None
    assert parse_beam(f"# Reasoning Path:\n{POLK}\n# Answer: Governor") == ([POLK], ["Governor"])
    # a second reasoning path after an answer is a path, not an answer
    two = f"# Reasoning Path:\n{POLK}\n# Answer:\nGovernor\n# Reasoning Path:\n{POLK}\n# Answer:\nLawyer"
    assert parse_beam(two) == ([POLK, POLK], ["Governor", "Lawyer"])
    prediction, _ = gcr_answers([f"# Reasoning Path:\n{POLK}\n# Answer:\n# Answer:\nGovernor"])
    assert prediction == ["Governor"]
    assert parse_beam(f"Sure:\n# Reasoning Path:\n{POLK}\n# Answer:\nGovernor") == ([POLK], ["Governor"])


def test_a_header_in_the_middle_of_a_line_is_a_header():
    """Review of issue 57: ``<PATH>...</PATH> # Answer: X`` on one line lost its answer."""
    assert parse_beam(f"# Reasoning Path:\n<PATH>{POLK}</PATH> # Answer: Governor") == ([POLK], ["Governor"])
    assert parse_beam(f"# Reasoning Path: {POLK} # Answer: Governor") == ([POLK], ["Governor"])


def test_each_part_of_a_beam_cites_its_own_paths():
    """Second review of issue 57: a beam of two path/answer parts cited both paths for both answers."""
    beam = ("# Reasoning Path:\nJamaica -> location.country.languages_spoken -> Jamaican English\n# Answer:\n"
            "Jamaican English\n# Reasoning Path:\nJamaica -> location.country.currency_used -> Jamaican dollar\n"
            "# Answer:\nJamaican dollar")  # fmt: skip
    prediction, cited = gcr_answers([beam])
    assert prediction == ["Jamaican English", "Jamaican dollar"]
    assert cited == [[["Jamaica", "location.country.languages_spoken", "Jamaican English"]],
                     [["Jamaica", "location.country.currency_used", "Jamaican dollar"]]]  # fmt: skip
    # a repeated answer header stays in its part
    assert gcr_answers([f"# Reasoning Path:\n{POLK}\n# Answer:\n# Answer:\nGovernor"])[1] == [[POLK.split(" -> ")]]
