"""The evaluate command on a small predictions file with hand-computed numbers."""

import json

import pytest

from kglightning.data.records import RecordError
from kglightning.evaluate import evaluate_predictions, main

LINES = [
    # q1: string with a trailing newline -> ["Paris", "Lyon", ""]: 1 gold matched of 1, precision 1/3
    {
        "id": "q1",
        "question": "?",
        "prediction": "Paris\nLyon\n",
        "ground_truth": ["Paris"],
        "confidence": [0.9, 0.6, 0.5],
    },
    # q2: list, de-duplicated -> ["Barack Obama", "Michelle"]; "Obama" matched, "Sasha" not
    {
        "id": "q2",
        "question": "?",
        "prediction": ["Barack Obama", "Barack Obama", "Michelle"],
        "ground_truth": ["Obama", "Sasha"],
        "confidence": {"Barack Obama": 0.8, "Michelle": 0.3},
    },
    # q3: our record format: "answer" instead of "ground_truth"; wrong
    {"id": "q3", "question": "?", "prediction": ["Rome"], "answer": ["Lyon"]},
    # q4: empty gold list: RoG crashes; here it is skipped and counted
    {"id": "q4", "question": "?", "prediction": ["x"], "ground_truth": []},
]

# per question (q1, q2, q3), computed by hand
ACC = [1.0, 0.5, 0.0]
HIT = [1.0, 1.0, 0.0]
HIT1 = [1.0, 1.0, 0.0]
PRECISION = [1 / 3, 0.5, 0.0]
RECALL = [1.0, 0.5, 0.0]
F1 = [2 * (1 / 3) * 1 / (1 / 3 + 1), 0.5, 0.0]
STRICT_F1 = [2 / 3, 0.0, 0.0]  # q1: {paris, lyon} vs {paris}


def _pct(xs):
    return sum(xs) * 100 / len(xs)  # RoG's formula


def _write(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines), encoding="utf-8")
    return path


def test_evaluate_writes_expected_numbers(tmp_path, capsys):
    pred = _write(tmp_path / "predictions.jsonl", LINES + [""])  # a trailing blank line is fine
    res = evaluate_predictions(pred, n_bins=10)

    rog_line = (
        f"Accuracy: {_pct(ACC)} Hit: {_pct(HIT)} Hit1: {_pct(HIT1)} F1: {_pct(F1)} "
        f"Precision: {_pct(PRECISION)} Recall: {_pct(RECALL)}"
    )
    text = (tmp_path / "eval_result.txt").read_text().splitlines()
    assert text[0] == rog_line
    assert text[0].startswith("Accuracy: 50.0 Hit: 66.66666666666667 Hit1: 66.66666666666667 F1: ")
    assert (
        text[1] == f"Strict-F1: {_pct(STRICT_F1)} Strict-Precision: {_pct([0.5, 0, 0])} "
        f"Strict-Recall: {_pct([1.0, 0, 0])} EM: 0.0"
    )
    assert text[2].startswith("ECE: ")
    assert rog_line in capsys.readouterr().out

    # confidences: (0.9, right), (0.6, wrong) [the empty line is skipped], (0.8, right), (0.3, wrong)
    # each alone in its bin -> ECE = mean(|1-.9|, |0-.6|, |1-.8|, |0-.3|) = 0.3, MCE = 0.6, Brier = 0.125
    assert res["ece"] == pytest.approx(30.0, abs=1e-4)
    assert res["mce"] == pytest.approx(60.0, abs=1e-4)
    assert res["brier"] == pytest.approx(12.5, abs=1e-4)
    assert res["n_questions"] == 3 and res["n_empty_gold"] == 1 and res["n_confidences"] == 4
    assert res["f1"] == _pct(F1) and res["hit1"] == _pct(HIT1)
    assert (tmp_path / "reliability.png").read_bytes()[:4] == b"\x89PNG"

    rows = [json.loads(x) for x in (tmp_path / "detailed_eval_result.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q2", "q3", "q4"]
    assert rows[0]["prediction"] == ["Paris", "Lyon", ""]
    assert rows[1]["prediction"] == ["Barack Obama", "Michelle"]
    assert rows[2]["ground_truth"] == ["Lyon"]
    for i, r in enumerate(rows[:3]):
        assert (r["acc"], r["hit"], r["hit1"], r["recall"]) == (ACC[i], HIT[i], HIT1[i], RECALL[i])
        assert r["f1"] == pytest.approx(F1[i]) and r["precision"] == pytest.approx(PRECISION[i])
        assert r["strict_f1"] == pytest.approx(STRICT_F1[i]) and r["em"] == 0.0
    assert rows[3]["f1"] is None and rows[3]["skipped"] == "empty ground_truth"


def test_no_confidence_no_plot_and_topk_names(tmp_path):
    pred = _write(tmp_path / "p.jsonl", [{"id": 1, "prediction": ["x", "y", "y"], "ground_truth": ["x"]}])
    out = tmp_path / "out"
    res = evaluate_predictions(pred, out, topk=1)  # keeps "y" (most frequent) only
    assert res["hit"] == 0.0 and "ece" not in res
    assert sorted(p.name for p in out.iterdir()) == ["p.detailed_eval_result_top_1.jsonl", "p.eval_result_top_1.txt"]
    assert len((out / "p.eval_result_top_1.txt").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ('{"id": "q2", "prediction": ["a", 3], "ground_truth": ["a"]}', "prediction"),
        ('{"id": "q2", "prediction": ["a"]}', "ground_truth"),
        ('{"id": "q2", "prediction": ["a"], "ground_truth": [1]}', "ground_truth"),
        ('{"id": "q2", "prediction": ["a"], "answer": {"x": 1}}', "answer"),
        ('{"prediction": ["a"], "ground_truth": ["a"]}', "id"),
        ('{"id": "q2", "prediction": ["a"], "ground_truth": ["a"], "confidence": [1.2]}', "confidence"),
        ('{"id": "q2", "prediction": ["a", "b"], "ground_truth": ["a"], "confidence": [0.2]}', "confidence"),
        ('{"id": "q2", "prediction": ["a", "b"], "ground_truth": ["a"], "confidence": {"a": 0.2}}', "confidence"),
        ('{"id": "q2", "prediction": "a", "ground_truth": ["a"], "confidence": "high"}', "confidence"),
        ('{"id": "q2", "prediction": ["a"], "ground_truth": ["a"]', None),
        ('["q2"]', None),
    ],
)
def test_malformed_line_names_file_line_and_field(tmp_path, bad, field):
    path = _write(tmp_path / "predictions.jsonl", [LINES[0], "", bad])
    with pytest.raises(RecordError) as info:
        evaluate_predictions(path)
    err = info.value
    assert (err.source, err.line, err.field) == (str(path), 3, field)
    assert f"{path}:3" in str(err)
    if field:
        assert f"'{field}'" in str(err)


def test_main(tmp_path, capsys):
    pred = _write(tmp_path / "predictions.jsonl", LINES)
    out = tmp_path / "o"
    assert main(["--predictions", str(pred), "--output", str(out), "--n_bins", "5"]) == 0
    assert (out / "eval_result.txt").exists() and (out / "reliability.png").exists()
    assert "Hit1:" in capsys.readouterr().out

    bad = _write(tmp_path / "bad.jsonl", ['{"id": 1}'])
    assert main(["--predictions", str(bad)]) == 2
    assert f"{bad}:1: field 'prediction'" in capsys.readouterr().err
    assert main(["--predictions", str(tmp_path / "missing.jsonl")]) == 2
    only_empty = _write(tmp_path / "e.jsonl", [LINES[3]])
    assert main(["--predictions", str(only_empty)]) == 2
    assert "no question" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([])


def _write_bytes(path, lines):
    path.write_bytes(b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines))
    return path


GOOD = LINES[0]


@pytest.mark.parametrize(
    ("lines", "where", "words"),
    [
        ([GOOD, b'{"id": "q2", "prediction": "caf\xe9", "ground_truth": ["a"]}'], ":2: ", "not valid UTF-8"),
        ([GOOD, b"", b'{"id": "q2", "prediction": ['], ":3: ", "invalid JSON"),
        ([b"[1, 2]"], ":1: ", "expected a JSON object"),
        ([GOOD, {**GOOD, "prediction": ["x"], "confidence": None}], ":2: field 'id'", "first seen at line 1"),
        ([{**GOOD, "confidence": [0.5]}], ":1: field 'confidence'", "1 values for 3 predictions"),
        ([], "", "no predictions"),
        ([b"", b"  "], "", "no predictions"),
        ([LINES[3]], "", "no question with a non-empty ground truth"),
    ],
)
@pytest.mark.parametrize("to_folder", [False, True])
def test_main_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, lines, where, words, to_folder):
    pred = _write_bytes(tmp_path / "predictions.jsonl", lines)
    out = tmp_path / "out"
    argv = ["--predictions", str(pred)] + (["--output", str(out)] if to_folder else [])
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith(f"kglightning evaluate: error: {pred}{where}") and words in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.jsonl"]  # no output folder, no empty files


def test_skip_bad_rows_on_request(tmp_path, capsys):
    pred = _write_bytes(tmp_path / "predictions.jsonl", [*LINES[:3], b"\xff", {**LINES[1], "prediction": ["x"]}])
    assert main(["--predictions", str(pred)]) == 2
    assert f"{pred}:4: not valid UTF-8" in capsys.readouterr().err
    assert main(["--predictions", str(pred), "--on-bad-record", "skip"]) == 0
    out = capsys.readouterr().out
    assert "2 bad rows skipped" in out
    rows = (tmp_path / "detailed_eval_result.jsonl").read_text().splitlines()
    assert [json.loads(r)["id"] for r in rows] == ["q1", "q2", "q3"]  # the duplicate q2 (line 5) is not scored twice
    res = evaluate_predictions(pred, on_bad_record="skip")
    assert res["n_skipped"] == 2 and res["n_questions"] == 3 and res["hit"] == _pct(HIT)


def test_an_evaluation_never_writes_over_its_predictions(tmp_path, capsys):
    """Issue 57 (a user's files): a predictions file named as one of RoG's outputs keeps its bytes; the results
    take its name first (and an output that would still land on the input is refused, exit 2)."""
    path = tmp_path / "detailed_eval_result.jsonl"
    path.write_text(json.dumps(LINES[0]) + "\n")
    kept = path.read_bytes()
    assert main(["--predictions", str(path)]) == 0 and path.read_bytes() == kept
    assert (tmp_path / "detailed_eval_result.detailed_eval_result.jsonl").exists()
    from kglightning.fileio import OutputOverInputError, check_outputs_apart
    from kglightning.metrics.evaluation import evaluation_files

    with pytest.raises(OutputOverInputError):
        check_outputs_apart(evaluation_files(tmp_path).values(), [path])


def test_two_splits_in_one_folder_get_results_of_their_own(tmp_path, capsys):
    for split, rows in (("validation", LINES[:1]), ("test", LINES[2:3])):
        (tmp_path / f"predictions_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert main(["--predictions", str(tmp_path / f"predictions_{split}.jsonl")]) == 0
    validation = (tmp_path / "predictions_validation.eval_result.txt").read_text()
    test = (tmp_path / "predictions_test.eval_result.txt").read_text()
    assert validation.startswith("Accuracy: 100.0") and test.startswith("Accuracy: 0.0")  # neither overwrote the other
    assert (tmp_path / "predictions_test.detailed_eval_result.jsonl").exists()
    assert not (tmp_path / "eval_result.txt").exists()  # RoG's names are for RoG's predictions.jsonl
