"""HotpotQA-style passage records: the three context shapes, and errors that name the file, line and field."""

from __future__ import annotations

import json

import pytest

from kglightning.data.records import RecordError
from kglightning.data.sources.passages import read_passage_examples


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_context_shapes(tmp_path):
    p = _write(
        tmp_path / "dev.jsonl",
        [
            {"_id": "a", "question": "q1", "answer": "x", "context": ["plain passage"]},
            {"question": "q2", "answer": ["y", "z"], "context": {"title": ["T"], "sentences": [["s1.", " s2."]]}},
        ],
    )
    got = read_passage_examples(p)
    assert [(e.id, e.answer, e.documents) for e in got] == [
        ("a", ["x"], ["plain passage"]),
        ("dev:line-2", ["y", "z"], ["T: s1. s2."]),
    ]
    assert read_passage_examples(p, id_prefix="validation")[1].id == "validation:line-2"


@pytest.mark.parametrize(
    ("row", "field", "message"),
    [
        ({"answer": "x", "context": []}, "question", "missing"),
        ({"question": "q", "answer": [], "context": []}, "answer", "non-empty"),
        ({"question": "q", "answer": "x", "context": "text"}, "context", "list of passages"),
        ({"question": "q", "answer": "x", "context": [3]}, "context", "string or a \\[title"),
    ],
)
def test_bad_records_name_file_line_and_field(tmp_path, row, field, message):
    p = _write(tmp_path / "dev.jsonl", [{"question": "ok", "answer": "x", "context": []}, row])
    with pytest.raises(RecordError, match=rf"dev.jsonl:2: field '{field}' .*{message}"):
        read_passage_examples(p)
    kept = read_passage_examples(p, on_bad_record="skip")
    assert [e.question for e in kept] == ["ok"]


def test_duplicate_ids_and_empty_files(tmp_path):
    p = _write(tmp_path / "a.jsonl", [{"id": "1", "question": "q", "answer": "x", "context": []}] * 2)
    with pytest.raises(RecordError, match="a.jsonl:2: field 'id' duplicate id '1'"):
        read_passage_examples(p)
    with pytest.raises(RecordError, match="b.jsonl.*no valid passage record"):
        read_passage_examples(_write(tmp_path / "b.jsonl", ["{not json"]), on_bad_record="skip")
