"""RoG records from published predictions whose prompts list reasoning paths (RoG / GNN-RAG predictions.jsonl)."""

from __future__ import annotations

import json

import pytest

from kglightning.cli import main as cli_main
from kglightning.data.records import RecordError
from kglightning.data.sources import read_records
from kglightning.data.sources.path_prompts import (
    PromptStats,
    parse_reasoning_paths,
    read_prompt_predictions,
    record_from_prompt,
    split_by_question,
)

PROMPT = (
    "[INST] <<SYS>>\n<</SYS>>\nBased on the reasoning paths, please answer the given question.\n\n"
    "Reasoning Paths:\n"
    "James K. Polk -> government.politician.positions -> m.04j60kc -> government.position.title -> Governor\n"
    "James K. Polk -> people.person.nationality -> United States of America\n"
    "\n"
    "James K. Polk -> people.person.profession -> Lawyer\n"
    "a line that is not a path\n"
    "X -> only.one.relation\n"
    "\nQuestion:\nwhat did james k polk do before he was president? [/INST]"
)


def _row(**over):
    row = {"id": "WebQTest-1", "question": "what did james k polk do before he was president",
           "prediction": "Governor\nPresident of Mars\n\n  Lawyer  ", "ground_truth": ["Governor", "Lawyer"],
           "input": PROMPT}  # fmt: skip
    return {**row, **over}


def test_paths_are_read_up_to_the_question_and_bad_lines_are_counted():
    stats = PromptStats()
    paths = parse_reasoning_paths(PROMPT, stats)
    assert paths == [
        ["James K. Polk", "government.politician.positions", "m.04j60kc", "government.position.title", "Governor"],
        ["James K. Polk", "people.person.nationality", "United States of America"],
        ["James K. Polk", "people.person.profession", "Lawyer"],
    ]
    assert (stats.paths, stats.malformed_paths) == (3, 2)
    assert stats.malformed_examples == ["a line that is not a path", "X -> only.one.relation"]
    assert parse_reasoning_paths("no paths in this prompt") == []
    assert parse_reasoning_paths("Reasoning Paths:\n\n\nQuestion:\nwhy?") == []


def test_a_predictions_line_becomes_a_record_with_the_paths_as_its_graph():
    stats = PromptStats()
    rec = record_from_prompt(_row(), stats=stats)
    assert rec.graph == [
        ("James K. Polk", "government.politician.positions", "m.04j60kc"),
        ("m.04j60kc", "government.position.title", "Governor"),
        ("James K. Polk", "people.person.nationality", "United States of America"),
        ("James K. Polk", "people.person.profession", "Lawyer"),
    ]
    assert rec.q_entity == ["James K. Polk"]
    assert rec.prediction == ["Governor", "President of Mars", "Lawyer"]  # one answer per non-empty line
    assert rec.answer == ["Governor", "Lawyer"] and rec.a_entity == ["Governor", "Lawyer"]
    assert (stats.records, stats.without_paths) == (1, 0)
    empty = record_from_prompt(_row(input="no paths"), stats=stats)
    assert empty.graph == [] and empty.q_entity == [] and stats.without_paths == 1


@pytest.mark.parametrize(
    ("over", "field"),
    [({"input": None}, "input"), ({"prediction": 3}, "prediction"), ({"question": ["q"]}, "question")],
)
def test_a_bad_line_names_the_file_the_line_and_the_field(tmp_path, over, field):
    path = tmp_path / "predictions.jsonl"
    path.write_text(json.dumps(_row()) + "\n" + json.dumps(_row(id="q2", **over)) + "\n")
    with pytest.raises(RecordError) as err:
        read_prompt_predictions(path)
    assert (err.value.source, err.value.line, err.value.field) == (str(path), 2, field)
    missing = _row()
    del missing["ground_truth"]
    path.write_text(json.dumps(missing) + "\n")
    with pytest.raises(RecordError, match="ground_truth"):
        read_prompt_predictions(path)
    path.write_text("{not json\n")
    with pytest.raises(RecordError, match=r"predictions.jsonl:1: invalid JSON"):
        read_prompt_predictions(path)


def test_the_split_is_by_question_seeded_and_complete():
    records = [record_from_prompt(_row(id=f"q{i}")) for i in range(50)]
    a, b = split_by_question(records, [0.6, 0.2, 0.2], seed=0), split_by_question(records, [0.6, 0.2, 0.2], seed=0)
    assert {k: [r.id for r in v] for k, v in a.items()} == {k: [r.id for r in v] for k, v in b.items()}
    assert [len(v) for v in a.values()] == [30, 10, 10]
    assert sorted(r.id for v in a.values() for r in v) == sorted(r.id for r in records)
    other = split_by_question(records, [0.6, 0.2, 0.2], seed=1)
    assert [r.id for r in other["test"]] != [r.id for r in a["test"]]
    with pytest.raises(ValueError, match="sum to 1"):
        split_by_question(records, [0.5, 0.2, 0.2], seed=0)


def test_the_cli_writes_splits_the_detector_reads(tmp_path, capsys):
    src = tmp_path / "predictions.jsonl"
    src.write_text("".join(json.dumps(_row(id=f"q{i}")) + "\n" for i in range(10)))
    out = tmp_path / "records"
    assert cli_main(["import-predictions", "--input", str(src), "--output", str(out), "--seed", "3"]) == 0
    assert "train 6, validation 2, test 2 questions" in capsys.readouterr().out
    test = read_records(str(out / "test.jsonl"))
    assert len(test) == 2 and test[0].prediction == ["Governor", "President of Mars", "Lawyer"]
    assert test[0].graph[0] == ("James K. Polk", "government.politician.positions", "m.04j60kc")


def test_hostile_lines_are_refused_with_their_place(tmp_path):
    path = tmp_path / "predictions.jsonl"
    cases = [
        (_row(ground_truth=["Governor", 1961]), "ground_truth"),
        (_row(id=True), "id"),
    ]
    for row, field in cases:
        path.write_text(json.dumps(row) + "\n")
        with pytest.raises(RecordError) as err:
            read_prompt_predictions(path)
        assert (err.value.line, err.value.field) == (1, field)
    path.write_text(json.dumps(_row(id=7)) + "\n" + json.dumps(_row(id="7")) + "\n")
    with pytest.raises(RecordError, match="repeats id '7' of line 1") as err:
        read_prompt_predictions(path)
    assert err.value.line == 2
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_row()).encode() + b"\n" + b'{"id": "\xff"}\n')
    with pytest.raises(RecordError, match="predictions.jsonl:2: not valid UTF-8"):
        read_prompt_predictions(path)
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(_row()).encode() + b"\n")  # a byte-order mark is fine
    assert len(read_prompt_predictions(path)) == 1


def test_a_question_on_the_header_line_ends_the_block():
    prompt = "Reasoning Paths:\nA -> r -> B\nQuestion: which X? Answer -> format -> entity\nC -> r -> D"
    assert parse_reasoning_paths(prompt) == [["A", "r", "B"]]


def test_split_sizes_add_up():
    records = [record_from_prompt(_row(id=f"q{i}")) for i in range(5)]
    sizes = [len(v) for v in split_by_question(records, [0.9, 0.1, 0.0], seed=0).values()]
    assert sum(sizes) == 5 and sizes[2] == 0
