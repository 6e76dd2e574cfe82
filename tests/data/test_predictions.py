"""The one predictions-jsonl reader behind ``evaluate`` and ``conformalize``: every failure names file, line, field."""

from __future__ import annotations

import json
import logging
import pickle

import pytest

from kglightning.data.predictions import PredictionLine, PredictionList, parse_prediction_line, read_predictions
from kglightning.data.records import RecordError

GOOD = {"id": "q1", "prediction": ["Paris", "Lyon"], "ground_truth": ["Paris"], "confidence": [0.9, 0.2]}


def _write(path, lines):
    path.write_bytes(
        b"".join(
            (x if isinstance(x, bytes) else (x if isinstance(x, str) else json.dumps(x)).encode()) + b"\n"
            for x in lines
        )
    )
    return path


def _raises(path, line, field, **kwargs) -> RecordError:
    with pytest.raises(RecordError) as info:
        read_predictions(path, **kwargs)
    err = info.value
    assert (err.source, err.line, err.field) == (str(path), line, field)
    where = str(path) if line is None else f"{path}:{line}:"
    assert str(err).startswith(where)
    if field is not None:
        assert f"field '{field}'" in str(err)
    return err


def test_reads_string_list_and_dict_forms(tmp_path):
    path = _write(
        tmp_path / "p.jsonl",
        [
            "\ufeff" + json.dumps(GOOD),  # a byte-order mark on line 1 is tolerated, as for records
            "",
            {"id": 2, "prediction": "a\nb\n", "answer": "a", "confidence": [0.5, 0.4, 0.0], "extra": 1},
            {"id": "q3", "prediction": ["x", "y"], "ground_truth": [], "confidence": {"x": 1, "y": 0.5}},
        ],
    )
    recs = read_predictions(path)
    assert isinstance(recs, PredictionList) and recs.source == str(path) and recs.skipped == []
    assert [r.id for r in recs] == ["q1", 2, "q3"] and [r.line for r in recs] == [1, 3, 4]
    assert recs[1].ground_truth == ["a"] and recs[1].prediction == "a\nb\n"  # bare string gold = one answer
    assert recs[1].row["extra"] == 1  # the whole row is kept for commands that pass it through
    assert recs[2].confidence == {"x": 1, "y": 0.5}
    assert "3 predictions kept, 0 skipped" in recs.summary()


@pytest.mark.parametrize(
    ("bad", "field", "words"),
    [
        (b'{"id": "q2", "prediction": ["a"], "ground_truth": ["a"]', None, "invalid JSON"),
        (b'["q2"]', None, "expected a JSON object, got list"),
        (b'{"id": "q2", "prediction": "caf\xe9", "ground_truth": ["a"]}', None, "not valid UTF-8"),
        ('{"prediction": ["a"], "ground_truth": ["a"]}', "id", "missing"),
        ('{"id": true, "prediction": ["a"], "ground_truth": ["a"]}', "id", "expected"),
        ('{"id": "", "prediction": ["a"], "ground_truth": ["a"]}', "id", "non-empty"),
        ('{"id": "q2", "ground_truth": ["a"]}', "prediction", "missing"),
        ('{"id": "q2", "prediction": 3, "ground_truth": ["a"]}', "prediction", "got int"),
        ('{"id": "q2", "prediction": ["a", 3], "ground_truth": ["a"]}', "prediction", "item 1"),
        ('{"id": "q2", "prediction": ["a"]}', "ground_truth", "missing"),
        ('{"id": "q2", "prediction": ["a"], "ground_truth": null}', "ground_truth", "null"),
        ('{"id": "q2", "prediction": ["a"], "answer": {"x": 1}}', "answer", "got dict"),
        ('{"id": "q2", "prediction": ["a"], "ground_truth": ["a"], "confidence": [1.2]}', "confidence", "item 0"),
        (
            '{"id": "q2", "prediction": ["a", "b"], "ground_truth": ["a"], "confidence": [0.2]}',
            "confidence",
            "1 values for 2",
        ),
        (
            '{"id": "q2", "prediction": "a\\nb", "ground_truth": ["a"], "confidence": [0.2]}',
            "confidence",
            "1 values for 2",
        ),
        (
            '{"id": "q2", "prediction": ["a", "b"], "ground_truth": ["a"], "confidence": {"a": 0.2}}',
            "confidence",
            "'b'",
        ),
        ('{"id": "q2", "prediction": ["a"], "ground_truth": ["a"], "confidence": {"a": "hi"}}', "confidence", "'a'"),
        ('{"id": "q2", "prediction": "a", "ground_truth": ["a"], "confidence": "high"}', "confidence", "got str"),
    ],
)
def test_bad_row_names_file_line_and_field(tmp_path, bad, field, words):
    path = _write(tmp_path / "predictions.jsonl", [GOOD, "", bad])
    err = _raises(path, 3, field)
    assert words in str(err)


def test_duplicate_id_names_both_lines(tmp_path):
    path = _write(tmp_path / "p.jsonl", [GOOD, {**GOOD, "id": "q2"}, {**GOOD, "prediction": ["z"], "confidence": None}])
    err = _raises(path, 3, "id")
    assert "duplicate id 'q1' (first seen at line 1)" in str(err)
    # an integer id and its string spelling are the same question (records read both as the string)
    path = _write(tmp_path / "q.jsonl", [{**GOOD, "id": 7}, {**GOOD, "id": "7"}])
    assert "first seen at line 1" in str(_raises(path, 2, "id"))


def test_require_confidence(tmp_path):
    path = _write(tmp_path / "p.jsonl", [GOOD, {"id": "q2", "prediction": ["a"], "answer": ["a"]}])
    assert len(read_predictions(path)) == 2
    assert "confidence per answer" in str(_raises(path, 2, "confidence", require_confidence=True))


@pytest.mark.parametrize("lines", [[], ["", "  "]])
def test_empty_file_is_an_error(tmp_path, lines):
    path = _write(tmp_path / "p.jsonl", lines) if lines else tmp_path / "p.jsonl"
    if not lines:
        path.write_bytes(b"")
    err = _raises(path, None, None)
    assert "no predictions" in str(err) and "empty" in str(err)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl: no such file"):
        read_predictions(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="is a directory"):
        read_predictions(tmp_path)


def test_skip_counts_and_logs_every_bad_row(tmp_path, caplog):
    path = _write(
        tmp_path / "p.jsonl",
        [GOOD, b"\xff\xfe", "{nope", {**GOOD, "id": "q2"}, {**GOOD, "id": "q1"}, {"id": "q3", "prediction": 1}],
    )
    with caplog.at_level(logging.WARNING, logger="kglightning.data.predictions"):
        recs = read_predictions(path, on_bad_record="skip")
    assert [r.id for r in recs] == ["q1", "q2"]
    assert [(e.line, e.field) for e in recs.skipped] == [(2, None), (3, None), (5, "id"), (6, "prediction")]
    warnings = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("skipping prediction row:") for m in warnings) == 4
    assert any(f"skipped 4 of 6 rows from {path}" in m for m in warnings)
    assert "2 predictions kept, 4 skipped" in recs.summary()


def test_skip_with_nothing_left_is_an_error(tmp_path):
    path = _write(tmp_path / "p.jsonl", ["{nope", '{"id": 1}'])
    err = _raises(path, None, None, on_bad_record="skip")
    assert "no valid predictions" in str(err) and "2 rows skipped" in str(err)


def test_on_bad_record_is_checked(tmp_path):
    with pytest.raises(ValueError, match="on_bad_record"):
        read_predictions(_write(tmp_path / "p.jsonl", [GOOD]), on_bad_record="ignore")


def test_parse_prediction_line_and_pickle():
    rec = parse_prediction_line(json.dumps(GOOD), "x.jsonl", 4)
    assert rec == PredictionLine("q1", ["Paris", "Lyon"], ["Paris"], [0.9, 0.2], 4, GOOD)
    with pytest.raises(RecordError) as info:
        parse_prediction_line("{", "x.jsonl", 4)
    err = pickle.loads(pickle.dumps(info.value))
    assert str(err).startswith("x.jsonl:4: invalid JSON")


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"id": 1' + "0" * 5000 + "}"])
def test_a_line_json_cannot_read_is_a_record_error_naming_its_place(text):
    with pytest.raises(RecordError, match=r"p\.jsonl:3: invalid JSON"):
        parse_prediction_line(text, "p.jsonl", 3)
