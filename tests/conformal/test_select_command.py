"""The ``select`` command and its reader (kglightning.conformal.selection_io, select_cli, selection_report)."""

from __future__ import annotations

import json
import logging
import random

import pytest
import torch

from kglightning.cli import main as cli_main
from kglightning.conformal.selection_io import read_scored as read_scored_file
from kglightning.conformal.selection_report import repeated_selection, split_by_question, summarize
from kglightning.data.records import RecordError


def main(argv):
    """The CLI on this module's files, which carry the detector's probabilities: ``select`` is told that column
    (its default is the logits, ``hallucination_logit``)."""
    if argv and argv[0] == "select" and "--score" not in argv:
        argv = [*argv, "--score", "hallucination_prob"]
    return cli_main(argv)


def read_scored(path, score="hallucination_prob", **kwargs):
    return read_scored_file(path, score=score, **kwargs)


def test_the_default_score_column_is_the_logits_and_a_file_without_it_says_so(tmp_path, capsys):
    rows = [
        {"id": f"q{i}", "prediction": ["x"], "hallucination_prob": [0.2], "hallucinated": [False]} for i in range(3)
    ]
    cal, test = _write(tmp_path / "c.jsonl", rows), _write(tmp_path / "t.jsonl", rows)
    assert cli_main(["select", "--calibration", str(cal), "--predictions", str(test)]) == 2
    err = capsys.readouterr().err
    assert "field 'hallucination_logit'" in err and "--score" in err
    with_logits = [dict(r, hallucination_logit=[-1.4]) for r in rows]
    assert read_scored_file(_write(tmp_path / "l.jsonl", with_logits)).answers.scores.tolist() == [-1.4] * 3


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _pool(n: int, seed: int = 0) -> list[dict]:
    """Questions with 1-4 answers; a hallucinated answer scores high (but not always), grounded or not."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        k = rng.randint(1, 4)
        bad = [rng.random() < 0.3 for _ in range(k)]
        probs = [round(min(1.0, max(0.0, rng.gauss(0.75 if b else 0.25, 0.2))), 4) for b in bad]
        grounding = [rng.choice(["exact", "ungrounded"]) for _ in range(k)]
        rows.append({"id": f"q{i}", "prediction": [f"a{i}_{j}" for j in range(k)], "hallucination_prob": probs,
                     "hallucinated": bad, "grounding": grounding, "extra": {"hops": rng.randint(1, 2)}})  # fmt: skip
    return rows


def test_read_scored_labels_groups_and_senses(tmp_path):
    rows = [
        {"id": "a", "prediction": ["Paris", "Lyon"], "confidence": [0.9, 0.2], "ground_truth": ["Paris"], "llm": "x"},
        {"id": 7, "prediction": "Rome\nOslo", "confidence": [0.6, 0.1], "answer": "Oslo", "llm": "y"},
    ]
    f = read_scored(_write(tmp_path / "p.jsonl", rows), score="confidence", sense="confidence", group_by="llm")
    assert f.answers.scores.tolist() == pytest.approx([0.1, 0.8, 0.4, 0.9])
    assert f.answers.hallucinated.tolist() == [False, True, True, False]
    assert f.answers.question.tolist() == [0, 0, 1, 1] and f.answers.group == ["x", "x", "y", "y"]
    assert f.labelled and f.names == [["Paris", "Lyon"], ["Rome", "Oslo"]]
    g = read_scored(_write(tmp_path / "q.jsonl", _pool(3)), group_by="extra.hops")
    assert set(g.answers.group) <= {"1", "2"}
    unlabelled = read_scored(
        _write(tmp_path / "u.jsonl", [{"id": 1, "prediction": ["x"], "hallucination_prob": [0.3]}])
    )
    assert not unlabelled.labelled and unlabelled.answers.hallucinated is None


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ({"id": "a", "prediction": ["x", "y"], "hallucination_prob": [0.1]}, "hallucination_prob", "list of 2 numbers"),
        ({"id": "a", "prediction": ["x"], "hallucination_prob": ["high"]}, "hallucination_prob", "finite number"),
        ({"id": "a", "prediction": ["x"], "hallucination_prob": [float("nan")]}, "hallucination_prob", "finite"),
        (
            {"id": "a", "prediction": ["x"], "hallucination_prob": [0.1], "hallucinated": [2]},
            "hallucinated",
            "booleans",
        ),
        ({"id": "a", "prediction": 3, "hallucination_prob": [0.1]}, "prediction", "list of strings"),
        ({"id": "", "prediction": ["x"], "hallucination_prob": [0.1]}, "id", "non-empty"),
        (
            {"id": "a", "prediction": ["x"], "hallucination_prob": [0.1], "grounding": ["a", "b"]},
            "grounding",
            "one value",
        ),
        ({"id": "a", "prediction": ["x"], "hallucination_prob": [0.1]}, "grounding", "missing"),
        ({"id": "a", "prediction": ["x"], "hallucination_prob": [int("1" * 400)]}, "hallucination_prob", "finite"),
        ({"id": "a", "prediction": ["x"], "hallucination_prob": [0.1], "grounding": ["all"]}, "grounding", "reserved"),
        ({"id": "a", "prediction": ["x", " "], "hallucination_prob": [0.1, 0.2]}, "prediction", "blank"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, row, field, words):
    good = {"id": "g", "prediction": ["x"], "hallucination_prob": [0.1], "grounding": ["exact"]}
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(row).replace("NaN", "NaN") + "\n")
    with pytest.raises(RecordError, match=words) as e:
        read_scored(path, group_by="grounding")
    assert e.value.line == 2 and e.value.field == field and e.value.source == str(path)
    skipped = read_scored(path, group_by="grounding", on_bad_record="skip")  # counted, the good row kept
    assert len(skipped.rows) == 1 and len(skipped.skipped) == 1


def test_hostile_json_and_duplicates(tmp_path):
    path = tmp_path / "h.jsonl"
    good = json.dumps({"id": "g", "prediction": ["x"], "hallucination_prob": [0.1]})
    path.write_text(good + "\n" + "[" * 100000 + "\n" + '{"id": 1' + "0" * 5000 + "}\n" + good + "\n")
    with pytest.raises(RecordError) as e:
        read_scored(path)
    assert e.value.line == 2
    f = read_scored(path, on_bad_record="skip")
    assert len(f.rows) == 1 and len(f.skipped) == 3 and "duplicate id" in str(f.skipped[-1])


def test_split_by_question_keeps_questions_whole():
    f = torch.tensor([0, 0, 1, 2, 2, 2, 3])
    from kglightning.conformal.selection import ScoredAnswers

    a = ScoredAnswers(torch.rand(7), f)
    m = split_by_question(a, 0.5, 0)
    for q in range(4):
        assert m[f == q].all() or (~m[f == q]).all()
    assert torch.equal(m, split_by_question(a, 0.5, 0)) and 0 < int(m.sum()) < 7
    with pytest.raises(ValueError, match="calibration_share"):
        split_by_question(a, 1.0, 0)


def test_repeated_selection_holds_on_exchangeable_data(tmp_path):
    f = read_scored(_write(tmp_path / "p.jsonl", _pool(400)), group_by="grounding")
    rows = repeated_selection(f.answers, ["fdr", "question", "kept_rate"], [0.1, 0.2], repeats=20)
    summary = summarize(rows)
    cells = {(c["rule"], c["alpha"], c["group"]): c for c in summary}
    assert cells[("keep_all", None, "all")]["power"] == 1.0
    for alpha in (0.1, 0.2):
        for g in ("all", "exact", "ungrounded"):
            assert cells[("fdr", alpha, g)]["achieved"] <= alpha + 0.03  # mean of 20 splits: a little noise
            assert cells[("fdr", alpha, g)]["power"] > 0.3
            assert cells[("question", alpha, g)]["achieved"] <= alpha + 0.04 or g == "all"
        # per group only: the union of two groups' bounds is up to twice alpha, and the report does not promise it
        assert cells[("question", alpha, "all")]["achieved"] <= 2 * alpha + 0.04
        assert cells[("question", alpha, "all")]["holds"] is None and cells[("fdr", alpha, "exact")]["holds"]
    assert len(rows) == 20 * (3 + 3 * 2 * 3)


def test_cli_apply_and_check(tmp_path, capsys):
    pool = _pool(300)
    cal, test = _write(tmp_path / "cal.jsonl", pool[:150]), _write(tmp_path / "test.jsonl", pool[150:])
    out = tmp_path / "kept.jsonl"
    argv = [
        "select",
        "--calibration",
        str(cal),
        "--predictions",
        str(test),
        "--alpha",
        "0.2",
        "--group-by",
        "grounding",
    ]
    assert main([*argv, "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.open()]
    assert len(rows) == 150
    for r in rows:
        assert sorted(r["kept"] + r["dropped"]) == sorted(r["prediction"]) and r["abstained"] == (not r["kept"])
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert set(summary["groups"]) == {"exact", "ungrounded"} and summary["achieved"]["all"]["kept"] > 0
    assert "test: FDR" in capsys.readouterr().out
    report = tmp_path / "report"
    pool_path = _write(tmp_path / "pool.jsonl", pool)
    args = ["select", "--pool", str(pool_path), "--repeats", "3", "--rule", "fdr", "question", "--alpha", "0.1", "0.2"]
    assert main([*args, "--report-dir", str(report)]) == 0
    assert (report / "selection.png").stat().st_size > 0 and "| fdr | 0.1 | all |" in (report / "report.md").read_text()
    assert len(json.loads((report / "report.json").read_text())["summary"]) == 5


def test_cli_errors_are_one_line(tmp_path, capsys):
    unlabelled = _write(tmp_path / "u.jsonl", [{"id": 1, "prediction": ["x"], "hallucination_prob": [0.3]}])
    other = _write(tmp_path / "u2.jsonl", [{"id": 2, "prediction": ["y"], "hallucination_prob": [0.4]}])
    assert main(["select", "--calibration", str(unlabelled), "--predictions", str(other)]) == 2
    assert "needs labels" in capsys.readouterr().err
    assert main(["select", "--predictions", str(unlabelled)]) == 2
    assert "needs --calibration" in capsys.readouterr().err
    assert main(["select", "--pool", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such file" in capsys.readouterr().err
    out = tmp_path / "never.jsonl"
    bad = _write(tmp_path / "b.jsonl", [{"id": 1, "prediction": ["x"], "hallucination_prob": [2, 3]}])
    assert main(["select", "--calibration", str(bad), "--predictions", str(other), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "b.jsonl:1: field 'hallucination_prob'" in err and not out.exists()


def test_one_per_question_keeps_one_seeded_answer_of_every_question():
    from kglightning.conformal.selection import ScoredAnswers
    from kglightning.conformal.selection_report import one_per_question

    q = torch.tensor([3, 3, 1, 2, 2, 2, 9])
    a = ScoredAnswers(torch.rand(7), q)
    picks = {tuple(one_per_question(a, s).tolist()) for s in range(20)}
    for p in picks:
        m = torch.tensor(p)
        assert sorted(q[m].tolist()) == [1, 2, 3, 9]
    assert len(picks) > 1 and one_per_question(a, 4).tolist() == one_per_question(a, 4).tolist()
    rows = repeated_selection(a.__class__(a.scores, q, None, torch.rand(7) < 0.5), ["fdr"], [0.2], repeats=2,
                              single_answer=True)  # fmt: skip
    assert all(r["answers"] <= 4 for r in rows)


def test_infinite_cuts_are_strict_json_and_float_groups_are_read(tmp_path):
    # no calibration answer is hallucinated: the question rule's cut is +inf, written as "inf" in strict JSON
    cal = [{"id": f"c{i}", "prediction": ["a"], "hallucination_prob": [0.2], "hallucinated": [False], "t": 1.5}
           for i in range(30)]  # fmt: skip
    test = [{"id": "t0", "prediction": ["a", "b"], "hallucination_prob": [0.1, 0.9], "t": 1.5}]
    c, t, out = _write(tmp_path / "c.jsonl", cal), _write(tmp_path / "t.jsonl", test), tmp_path / "o.jsonl"
    args = ["select", "--calibration", str(c), "--predictions", str(t), "--rule", "question", "--group-by", "t"]
    assert main([*args, "--output", str(out)]) == 0

    def strict(text):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))

    row = strict(out.read_text())
    assert row["selection"]["cuts"] == {"1.5": "inf"} and row["kept"] == ["a", "b"]
    assert strict(out.with_suffix(".summary.json").read_text())["groups"]["1.5"]["cut"] == "inf"


def test_unlabelled_calibration_row_is_named_by_line(tmp_path, capsys):
    rows = _pool(5)
    del rows[3]["hallucinated"]
    cal = _write(tmp_path / "cal.jsonl", rows)
    test = _write(tmp_path / "test.jsonl", _pool(3))
    assert main(["select", "--calibration", str(cal), "--predictions", str(test)]) == 2
    assert "cal.jsonl:4: field 'hallucinated'" in capsys.readouterr().err


def test_rows_with_no_answer_or_an_empty_gold_list_follow_one_rule_each(tmp_path, capsys, caplog):
    rows = _pool(30)
    for r in rows:  # labels from gold answers: the answers named a{i}_0 are right
        r["ground_truth"] = [f"a{r['id'][1:]}_0"]
        del r["hallucinated"]
    rows[2]["ground_truth"] = []  # no gold answer: the row is left out of calibration, not the whole file
    rows[5]["prediction"], rows[5]["hallucination_prob"] = "", []  # no answer: a question that keeps nothing
    del rows[6]["hallucination_prob"]
    rows[6]["prediction"] = []  # no answer and no score column
    cal = _write(tmp_path / "cal.jsonl", rows)
    test = _write(tmp_path / "test.jsonl", rows[:8])
    out = tmp_path / "out.jsonl"
    args = ["select", "--calibration", str(cal), "--predictions", str(test), "--rule", "question", "--alpha", "0.2"]
    with caplog.at_level(logging.WARNING):
        assert main([*args, "--output", str(out)]) == 0, capsys.readouterr().err
    assert "left 1 of 30 calibration rows out, whose gold answer list is empty" in caplog.text
    assert "first at line 3" in caplog.text
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 8 and written[5]["kept"] == [] and written[5]["abstained"] and written[6]["abstained"]
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["n_calibration_no_gold"] == 1 and summary["n_test_no_answer"] == 2
    f = read_scored(cal)
    assert f.no_gold_lines == [3] and f.no_answer_rows == 2 and f.no_label_field is None and f.first_unlabelled == 3
    assert not f.labelled and f.labelled_rows == 29
    # the pool follows the same rule
    assert main(["select", "--pool", str(cal), "--repeats", "2", "--rule", "question", "--report-dir",
                 str(tmp_path / "rep")]) == 0  # fmt: skip
    # a file whose every gold list is empty cannot calibrate
    for r in rows:
        r["ground_truth"] = []
    bare = _write(tmp_path / "bare.jsonl", rows)
    assert main(["select", "--calibration", str(bare), "--predictions", str(test)]) == 2
    assert "no calibration row has a gold answer" in capsys.readouterr().err


def test_cli_flags_lists_of_other_lengths(tmp_path, capsys):
    rows = _pool(60)
    short = [{**r, "prediction": r["prediction"][:1], "hallucination_prob": r["hallucination_prob"][:1],
              "hallucinated": r["hallucinated"][:1], "grounding": r["grounding"][:1]} for r in rows]  # fmt: skip
    long = [{**r, "id": f"t{i}", "prediction": r["prediction"] * 3, "hallucination_prob": r["hallucination_prob"] * 3,
             "hallucinated": r["hallucinated"] * 3, "grounding": r["grounding"] * 3} for i, r in enumerate(rows)]  # fmt: skip
    cal, test = _write(tmp_path / "cal.jsonl", short), _write(tmp_path / "test.jsonl", long)
    assert main(["select", "--calibration", str(cal), "--predictions", str(test)]) == 0
    out = capsys.readouterr().out
    assert "(WARNING: calibration and test questions have answer lists of different lengths, p = " in out
    assert "1.00 against 7.05 answers on average" in out  # the pool's 1-4 answers, three times over
    summary = json.loads((tmp_path / "test.selected.summary.json").read_text())
    assert summary["groups"]["all"]["length_pvalue"] < 0.01
    alike = _write(tmp_path / "alike.jsonl", short)  # the same kind of lists (and the same ids: warned, not refused)
    args = ["select", "--calibration", str(cal), "--predictions", str(alike), "--output", str(tmp_path / "o")]
    assert main(args) == 0
    assert "WARNING" not in capsys.readouterr().out


def test_select_never_writes_over_its_inputs(tmp_path, capsys):
    """Issue 57 (a user's files): ``--output`` naming an input, or a report folder holding the pool under a report
    file's name, is refused with exit 2 and the input is kept."""
    cal, test = _write(tmp_path / "cal.jsonl", _pool(40)), _write(tmp_path / "test.jsonl", _pool(20, 1))
    kept = test.read_bytes()
    argv = ["select", "--calibration", str(cal), "--predictions", str(test), "--output", str(test)]
    assert main(argv) == 2 and "over the input" in capsys.readouterr().err and test.read_bytes() == kept
    pool = _write(tmp_path / "splits.json", _pool(40))
    kept = pool.read_bytes()
    assert main(["select", "--pool", str(pool), "--report-dir", str(tmp_path), "--repeats", "2"]) == 2
    assert "over the input" in capsys.readouterr().err and pool.read_bytes() == kept


def test_fdr_on_answer_lists_is_flagged_in_the_summary_the_output_and_the_report(tmp_path, capsys, caplog):
    pool = _pool(300)  # 1 to 4 answers per question
    cal, test = _write(tmp_path / "cal.jsonl", pool[:150]), _write(tmp_path / "test.jsonl", pool[150:])
    out = tmp_path / "kept.jsonl"
    argv = ["select", "--calibration", str(cal), "--predictions", str(test), "--rule", "fdr", "--output", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert (
        "group all: kept" in printed and "(WARNING: its questions carry several answers; rule 'fdr' assumes" in printed
    )
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["groups"]["all"]["clustered"] is True
    assert summary["groups"]["all"]["n_calibration"] == 150  # questions, not answers
    assert main([*argv[:5], "--rule", "top", "--output", str(out)]) == 0  # top: no such warning
    assert "WARNING" not in capsys.readouterr().out
    report = tmp_path / "report"
    args = ["select", "--pool", str(_write(tmp_path / "pool.jsonl", pool)), "--repeats", "3", "--rule", "fdr", "top"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert main([*args, "--report-dir", str(report)]) == 0
    assert "**fdr on answer lists**" in (report / "report.md").read_text()
    assert caplog.text.count("exchangeable one by one") == 1  # once for the whole check, not once per split
    cells = json.loads((report / "report.json").read_text())["summary"]
    assert {c["rule"]: c["clustered"] for c in cells} == {"keep_all": False, "fdr": True, "top": False}
    assert main([*args, "--one-per-question", "--report-dir", str(tmp_path / "one")]) == 0
    assert "fdr on answer lists" not in (tmp_path / "one" / "report.md").read_text()


def test_labels_from_gold_answers_agree_with_the_detector(tmp_path, capsys, caplog):
    nfd = "Zu\u0308rich"  # the NFD spelling of Zürich: the detector's answer_key calls them one name
    rows = [
        {"id": "the", "prediction": ["Paris", "the", "THE"], "ground_truth": ["The"]},  # RoG: "" matched everything
        {"id": "a", "prediction": ["Lyon", "A"], "ground_truth": ["A"]},
        {"id": "nfc", "prediction": ["Zürich", "Bern"], "ground_truth": [nfd]},  # RoG: NFC answer, NFD gold, a miss
        {"id": "texas", "prediction": ["Paris, Texas", "paris"], "ground_truth": ["Paris"]},  # RoG: both match
        {"id": "blank", "prediction": ["x", "y"], "ground_truth": [" ", ""]},  # no usable gold: unlabelled
        {"id": "empty", "prediction": ["z"], "ground_truth": ""},
    ]
    for r in rows:
        r["hallucination_prob"] = [0.5] * len(r["prediction"])
    f = read_scored(_write(tmp_path / "g.jsonl", rows))
    assert f.row_labelled == [True, True, True, True, False, False] and f.no_gold_lines == [5, 6]
    assert f.answer_labels.tolist() == [True, False, False, True, False, False, True, True, False, False, False, False]
    # left out of calibration and counted, like ground_truth: []
    cal = _write(tmp_path / "cal.jsonl", [*rows, *_pool(40)])
    out = tmp_path / "out.jsonl"
    with caplog.at_level(logging.WARNING):
        test = _write(tmp_path / "test.jsonl", _pool(3))
        assert main(["select", "--calibration", str(cal), "--predictions", str(test), "--output", str(out)]) == 0
    assert json.loads(out.with_suffix(".summary.json").read_text())["n_calibration_no_gold"] == 2
    assert "left 2 of 46 calibration rows out, whose gold answer list is empty or blank" in caplog.text


def test_the_detectors_null_label_leaves_a_row_out_and_counts_it(tmp_path, capsys):
    """Second review of issue 57: the detector writes ``hallucinated: null`` for a question without gold answers;
    ``select`` stopped on it (no label field) where an empty gold list is left out and counted."""
    rows = _pool(60)
    rows.append({"id": "blank", "prediction": ["x", "y"], "hallucination_prob": [0.2, 0.9], "hallucinated": None})
    pool = _write(tmp_path / "pool.jsonl", rows)
    assert main(["select", "--pool", str(pool), "--repeats", "2", "--report-dir", str(tmp_path / "rep")]) == 0
    f = read_scored(pool)
    assert f.no_gold_lines == [61] and f.labelled_rows == 60


def test_calibration_and_selection_on_the_same_questions_is_refused_or_warned(tmp_path, capsys, caplog):
    """Second review of issue 57: the same file as --calibration and --predictions reported an in-sample FDR as if
    the test questions were fresh."""
    pool = _write(tmp_path / "pool.jsonl", _pool(60))
    argv = ["select", "--calibration", str(pool), "--predictions", str(pool), "--output", str(tmp_path / "o.jsonl")]
    assert main(argv) == 2 and "same file" in capsys.readouterr().err
    copy = _write(tmp_path / "copy.jsonl", _pool(60)[:10])
    with caplog.at_level(logging.WARNING):
        assert main([*argv[:4], str(copy), *argv[5:]]) == 0
    assert "share 10 question ids" in caplog.text


def test_pools_of_different_splits_get_reports_of_their_own_by_default(tmp_path, monkeypatch):
    """Issue 59: outputs of different splits never share a file name; the default report folder was one for all."""
    monkeypatch.chdir(tmp_path)
    for split, seed in (("validation", 0), ("test", 1)):
        _write(tmp_path / f"scored_{split}.jsonl", _pool(60, seed=seed))
        assert main(["select", "--pool", f"scored_{split}.jsonl", "--repeats", "2"]) == 0
    for split in ("validation", "test"):
        report = tmp_path / "outputs/selection" / f"scored_{split}" / "report.md"
        assert report.is_file() and f"scored_{split}.jsonl" in report.read_text()
