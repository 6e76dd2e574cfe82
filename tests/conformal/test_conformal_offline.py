"""The ``conformalize`` command: split-conformal sets for any predictions file with confidences."""

from __future__ import annotations

import json
import random

import pytest

from kglightning.cli import main
from kglightning.conformal.offline import conformalize
from kglightning.data.records import RecordError


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _row(i, preds, conf, gold):
    return {"id": f"q{i}", "prediction": preds, "confidence": conf, "answer": gold}


def test_threshold_sets_and_summary(tmp_path):
    # calibration scores (1 - confidence of the best correct answer): 0.1, 0.2, ..., 0.8 and one +inf (missed)
    cal = [_row(i, ["right", "wrong"], [round(0.9 - 0.1 * i, 2), 0.95], ["right"]) for i in range(8)]
    cal.append(_row(8, ["wrong"], [0.9], ["right"]))
    test = [
        _row(0, ["Paris", "Lyon", "Nice"], [0.9, 0.5, 0.1], ["Paris"]),
        _row(1, ["Lyon", "Paris"], [0.75, 0.2], ["Paris"]),
        _row(2, ["x"], [0.3], []),  # no gold: counted in APSS, not in ECR
    ]
    c, t = _write(tmp_path / "cal.jsonl", cal), _write(tmp_path / "test.jsonl", test)
    s = conformalize(c, t, alpha=0.3)  # n=9: rank ceil(10 * 0.7) = 7 -> 0.7
    assert s["qhat"] == pytest.approx(0.7) and s["calibration_missed"] == 1 and not s["full_sets"]
    rows = [json.loads(line) for line in (tmp_path / "test.conformal.jsonl").open()]
    assert [r["conformal_set"] for r in rows] == [["Paris", "Lyon"], ["Lyon"], ["x"]]
    assert rows[0]["conformal_qhat"] == pytest.approx(0.7) and rows[0]["conformal_full_set"] is False
    assert s["ecr"] == 0.5 and s["apss"] == pytest.approx(4 / 3)
    assert json.loads((tmp_path / "test.conformal.summary.json").read_text())["n_test"] == 3
    # alpha too small for 9 questions: +inf, full sets, flagged
    s = conformalize(c, t, alpha=0.05, output=tmp_path / "full.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "full.jsonl").open()]
    assert (
        s["full_sets"]
        and all(r["conformal_full_set"] for r in rows)
        and rows[0]["conformal_set"] == test[0]["prediction"]
    )


def test_coverage_on_exchangeable_questions(tmp_path):
    rng = random.Random(0)

    def question(i):
        n = rng.randint(1, 6)
        conf = [rng.random() for _ in range(n)]
        preds = [f"a{i}_{j}" for j in range(n)]
        gold = [preds[j] for j in range(n) if rng.random() < conf[j] * 0.8][:1]
        return _row(i, preds, conf, gold or ["none"])

    c = _write(tmp_path / "cal.jsonl", [question(i) for i in range(600)])
    t = _write(tmp_path / "test.jsonl", [question(i) for i in range(3000)])
    for alpha in (0.5, 0.6):
        s = conformalize(c, t, alpha)
        assert not s["full_sets"] and s["ecr"] >= 1 - alpha - 0.03


def test_missing_confidence_names_file_line_and_field(tmp_path):
    c = _write(
        tmp_path / "cal.jsonl", [_row(0, ["a"], [0.5], ["a"]), {"id": "q1", "prediction": ["a"], "answer": ["a"]}]
    )
    with pytest.raises(RecordError, match=r"cal.jsonl:2: field 'confidence'"):
        conformalize(c, c, 0.2)


def test_cli_subcommand(tmp_path, capsys):
    c = _write(tmp_path / "cal.jsonl", [_row(i, ["a"], [0.9], ["a"]) for i in range(20)])
    assert main(["conformalize", "--calibration", str(c), "--predictions", str(c), "--alpha", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "qhat=0.1" in out and "ECR 1.0000" in out and (tmp_path / "cal.conformal.jsonl").exists()
