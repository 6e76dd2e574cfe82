"""The ``conformalize`` command: split-conformal sets for any predictions file with confidences."""

from __future__ import annotations

import json
import random

import pytest

from kglightning.cli import main
from kglightning.conformal.conformalize_cli import main as offline_main
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


def _write_bytes(path, rows):
    path.write_bytes(b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in rows))
    return path


CAL = [_row(i, ["a", "b"], [0.9, 0.1], ["a"]) for i in range(10)]
TEST = [_row(i, ["a", "b"], [0.8, 0.3], ["a"]) for i in range(3)]


@pytest.mark.parametrize(
    ("which", "rows", "where", "words"),
    [
        ("cal", [*CAL[:2], b'{"id": "q9", "prediction": "caf\xe9"}'], ":3: ", "not valid UTF-8"),
        ("test", [TEST[0], b'{"id": "q9", '], ":2: ", "invalid JSON"),
        ("test", [TEST[0], b"17"], ":2: ", "expected a JSON object, got int"),
        ("test", [*TEST, TEST[1]], ":4: field 'id'", "duplicate id 'q1' (first seen at line 2)"),
        ("cal", [*CAL, CAL[0]], ":11: field 'id'", "duplicate id 'q0' (first seen at line 1)"),
        ("test", [TEST[0], {"id": "q9", "prediction": ["a"], "answer": ["a"]}], ":2: field 'confidence'", "per answer"),
        ("test", [TEST[0], {**TEST[1], "confidence": {"a": 0.5}}], ":2: field 'confidence'", "'b'"),
        ("test", [TEST[0], {**TEST[1], "prediction": ["a", 1]}], ":2: field 'prediction'", "item 1"),
        ("test", [], "", "no predictions"),
        ("cal", [b""], "", "no predictions"),
    ],
)
def test_main_bad_input_is_one_line_and_writes_nothing(tmp_path, capsys, which, rows, where, words):
    files = {"cal": _write(tmp_path / "cal.jsonl", CAL), "test": _write(tmp_path / "test.jsonl", TEST)}
    bad = _write_bytes(files[which], rows)
    argv = ["--calibration", str(files["cal"]), "--predictions", str(files["test"]), "--alpha", "0.2"]
    assert offline_main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith(f"kglightning conformalize: error: {bad}{where}") and words in captured.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.jsonl", "test.jsonl"]  # no output, no summary


def test_main_bad_alpha_and_missing_file(tmp_path, capsys):
    c = _write(tmp_path / "cal.jsonl", CAL)
    assert offline_main(["--calibration", str(c), "--predictions", str(c), "--alpha", "1.5"]) == 2
    assert "alpha" in capsys.readouterr().err
    assert offline_main(["--calibration", str(tmp_path / "nope.jsonl"), "--predictions", str(c), "--alpha", "0.2"]) == 2
    assert f"{tmp_path / 'nope.jsonl'}: no such file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cal.jsonl"]


def test_skip_bad_rows_on_request(tmp_path, capsys):
    c = _write_bytes(tmp_path / "cal.jsonl", [*CAL, b"\xff", {"id": "q99", "prediction": ["a"], "answer": ["a"]}])
    t = _write_bytes(tmp_path / "test.jsonl", [*TEST, TEST[0]])
    argv = ["--calibration", str(c), "--predictions", str(t), "--alpha", "0.2"]
    assert offline_main(argv) == 2
    assert offline_main([*argv, "--on-bad-record", "skip"]) == 0
    assert "3 bad rows skipped" in capsys.readouterr().out
    rows = [json.loads(x) for x in (tmp_path / "test.conformal.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q0", "q1", "q2"]  # the repeated q0 is written once
    summary = json.loads((tmp_path / "test.conformal.summary.json").read_text())
    assert summary["n_calibration"] == 10 and summary["n_calibration_skipped"] == 2 and summary["n_test_skipped"] == 1


def test_group_by_calibrates_each_group_on_its_own(tmp_path, capsys):
    """Two kinds of question whose scores differ: pooled, one qhat undercovers the hard kind; grouped, each kind
    reaches 1 - alpha on its own, and a kind with no calibration question gets full sets, flagged."""
    rng = random.Random(0)

    def rows(n, first):
        out = []
        for i in range(first, first + n):
            hard = i % 2 == 0
            right = rng.random() * (0.5 if hard else 1.0) + (0.0 if hard else 0.0)
            conf = [round(right if hard else 0.5 + right / 2, 4), round(rng.random() * (0.9 if hard else 0.4), 4)]
            out.append({"id": f"q{i}", "prediction": ["right", "wrong"], "confidence": conf, "answer": ["right"],
                        "extra": {"kind": "hard" if hard else "easy"}})  # fmt: skip
        return out

    cal, test = _write(tmp_path / "cal.jsonl", rows(400, 0)), _write(tmp_path / "test.jsonl", rows(2000, 1000))
    pooled = conformalize(cal, test, alpha=0.2, output=tmp_path / "p.jsonl")
    grouped = conformalize(cal, test, alpha=0.2, output=tmp_path / "g.jsonl", group_by="extra.kind")
    assert "groups" not in pooled
    pooled_rows = [json.loads(line) for line in (tmp_path / "p.jsonl").open()]
    hard_pooled = [("right" in r["conformal_set"]) for r in pooled_rows if r["extra"]["kind"] == "hard"]
    assert sum(hard_pooled) / len(hard_pooled) < 0.7  # one qhat for both kinds: the hard one is under-covered
    hard, easy = grouped["groups"]["hard"], grouped["groups"]["easy"]
    assert hard["n_calibration"] == easy["n_calibration"] == 200
    assert abs(hard["ecr"] - 0.8) < 0.04 and abs(easy["ecr"] - 0.8) < 0.04 and hard["qhat"] != easy["qhat"]
    first = json.loads((tmp_path / "g.jsonl").open().readline())
    assert first["conformal_group"] in ("hard", "easy")
    # a group only the test file has: full sets, flagged; a row without the key: an error naming file, line, field
    lone = _write(tmp_path / "lone.jsonl", [{**rows(1, 5000)[0], "extra": {"kind": "new"}}])
    s = conformalize(cal, lone, alpha=0.2, output=tmp_path / "l.jsonl", group_by="extra.kind")
    assert s["groups"]["new"]["full_sets"] and s["groups"]["new"]["n_calibration"] == 0 and s["full_sets"]
    bare = _write(tmp_path / "bare.jsonl", [{k: v for k, v in rows(1, 6000)[0].items() if k != "extra"}])
    with pytest.raises(RecordError, match="extra.kind") as e:
        conformalize(cal, bare, alpha=0.2, group_by="extra.kind")
    assert e.value.line == 1 and e.value.field == "extra.kind"
    assert offline_main(["--calibration", str(cal), "--predictions", str(test), "--alpha", "0.2",
                         "--group-by", "extra.kind", "--output", str(tmp_path / "m.jsonl")]) == 0  # fmt: skip
    assert "group hard: qhat=" in capsys.readouterr().out


def test_group_by_edges_reserved_skip_and_whole_floats(tmp_path):
    def row(i, kind):
        return {"id": f"q{i}", "prediction": ["right", "wrong"], "confidence": [0.9, 0.1], "answer": ["right"],
                "kind": kind}  # fmt: skip

    cal = _write(tmp_path / "cal.jsonl", [row(i, 2 if i % 2 else 2.0) for i in range(20)])
    test = _write(tmp_path / "test.jsonl", [row(100, 2), {k: v for k, v in row(101, 1).items() if k != "kind"}])
    s = conformalize(cal, test, alpha=0.2, output=tmp_path / "o.jsonl", group_by="kind", on_bad_record="skip")
    assert list(s["groups"]) == ["2"] and s["groups"]["2"]["n_calibration"] == 20  # 2 and 2.0: one group
    assert s["n_test_skipped"] == 1 and s["n_test"] == 1 and s["qhat"] is None  # the row without 'kind': skipped
    named_all = _write(tmp_path / "all.jsonl", [row(i, "all") for i in range(20)])
    assert conformalize(named_all, named_all, alpha=0.2, output=tmp_path / "a.jsonl", group_by="kind")["qhat"] is None
    bad = _write(tmp_path / "nan.jsonl", [row(0, float("nan"))])
    with pytest.raises(RecordError, match="finite"):
        conformalize(cal, bad, alpha=0.2, group_by="kind")


def test_a_full_set_group_says_why(tmp_path, capsys):
    """A group's qhat is infinite for one of three reasons, and the summary and the printed line name the right one:
    no calibration question, too few for alpha, or more misses than the rank allows (7 of 40 at alpha 0.2: 8 misses,
    a fifth of them, already make qhat infinite)."""
    cal = [_row(i, ["a", "b"], [0.9, 0.1], ["a" if i % 2 else "zzz"]) for i in range(40)]  # half miss
    for r in cal:
        r["kind"] = "many"
    cal += [{**_row(100 + i, ["a"], [0.8], ["a"]), "kind": "few"} for i in range(3)]  # (3+1)*0.8 > 3
    test = [{**_row(200, ["a"], [0.8], ["a"]), "kind": k} for k in ("many", "few", "new")]
    for i, r in enumerate(test):
        r["id"] = f"t{i}"
    s = conformalize(_write(tmp_path / "cal.jsonl", cal), _write(tmp_path / "t.jsonl", test), alpha=0.2,
                     output=tmp_path / "o.jsonl", group_by="kind")  # fmt: skip
    g = s["groups"]
    assert g["many"]["calibration_missed"] == 20 and g["few"]["calibration_missed"] == 0
    assert g["many"]["full_set_reason"].endswith("(20; at most 7 may miss for alpha)")
    assert g["few"]["full_set_reason"] == "too few calibration questions for alpha"
    assert g["new"]["full_set_reason"] == "no calibration question"
    offline_main(["--calibration", str(tmp_path / "cal.jsonl"), "--predictions", str(tmp_path / "t.jsonl"),
                  "--alpha", "0.2", "--group-by", "kind", "--output", str(tmp_path / "m.jsonl")])  # fmt: skip
    out = capsys.readouterr().out
    assert "group many: qhat=None from 40 calibration questions (20 with no correct proposed answer)" in out
    assert (
        "(too many calibration questions with no correct proposed answer (20; at most 7 may miss for alpha): full"
        in out
    )
    assert "(too few calibration questions for alpha: full sets" in out
    lean = [{**_row(300 + i, ["a"], [0.9], ["a" if i >= 8 else "zzz"]), "kind": "lean"} for i in range(40)]
    s = conformalize(_write(tmp_path / "lean.jsonl", lean), _write(tmp_path / "t2.jsonl", [{**test[0], "kind": "lean"}]),
                     alpha=0.2, output=tmp_path / "o2.jsonl", group_by="kind")  # fmt: skip
    assert s["groups"]["lean"]["full_set_reason"].endswith("(8; at most 7 may miss for alpha)")


def test_new_questions_without_gold_answers_get_sets(tmp_path, capsys):
    """The file to add sets to may hold new questions: no ``ground_truth`` there is not an error (the calibration
    file still needs it), and the coverage is then not reported."""
    cal = _write(tmp_path / "cal.jsonl", [_row(i, ["a", "b"], [0.9, 0.4], ["a"]) for i in range(20)])
    new = _write(tmp_path / "new.jsonl", [{"id": "n1", "prediction": ["a", "b"], "confidence": [0.95, 0.3]}])
    s = conformalize(cal, new, alpha=0.2, output=tmp_path / "o.jsonl")
    assert s["ecr"] is None and json.loads((tmp_path / "o.jsonl").read_text())["conformal_set"] == ["a"]
    assert offline_main(["--calibration", str(new), "--predictions", str(cal), "--alpha", "0.2"]) == 2
    assert "field 'ground_truth'" in capsys.readouterr().err
    assert offline_main(["--calibration", str(cal), "--predictions", str(new), "--alpha", "0.2"]) == 0
    assert "test: APSS 1.00 over 1 questions (none has gold answers: no ECR)" in capsys.readouterr().out
    mixed = _write(tmp_path / "mixed.jsonl", [json.loads(new.read_text()), _row(99, ["a"], [0.9], ["zzz"])])
    s = conformalize(cal, mixed, alpha=0.2, output=tmp_path / "m.jsonl")
    assert s["n_gold"] == 1 and s["ecr"] == 0.0 and s["n_test"] == 2
    offline_main(["--calibration", str(cal), "--predictions", str(mixed), "--alpha", "0.2"])
    assert "ECR 0.0000 over the 1 questions with gold answers, APSS 1.00 over 2 questions" in capsys.readouterr().out


def test_the_output_never_replaces_an_input(tmp_path, capsys):
    """Issue 57 (a user's files): an output, or its summary, that would replace an input is refused, exit 2."""
    rng = random.Random(0)
    rows = [_row(i, ["a", "b"], [rng.random(), rng.random()], ["a"]) for i in range(20)]
    cal, test = _write(tmp_path / "out.summary.json", rows), _write(tmp_path / "test.jsonl", rows)
    kept = cal.read_bytes(), test.read_bytes()
    for output in (test, tmp_path / "out.jsonl"):  # the test file itself; a summary over the calibration file
        code = offline_main(["--calibration", str(cal), "--predictions", str(test), "--alpha", "0.2",
                             "--output", str(output)])  # fmt: skip
        assert code == 2 and "over the input" in capsys.readouterr().err
    assert (cal.read_bytes(), test.read_bytes()) == kept and not (tmp_path / "out.jsonl").exists()


def test_a_coverage_plot_is_written_beside_the_sets_when_the_test_rows_have_gold(tmp_path, capsys):
    """Issue 59 (a plot where a person would rather look than read): ``<output>.png``, the test coverage per group
    against 1 - alpha; none for questions without gold answers (no coverage to draw)."""
    cal = _write(tmp_path / "cal.jsonl", [{**_row(i, ["a", "b"], [0.9, 0.4], ["a"]), "kind": "k" + str(i % 2)}
                                          for i in range(40)])  # fmt: skip
    s = conformalize(cal, cal, alpha=0.2, output=tmp_path / "sets.jsonl", group_by="kind")
    png = tmp_path / "sets.png"
    assert s["plot"] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "sets.summary.json").read_text())["plot"] == str(png)
    assert offline_main(["--calibration", str(cal), "--predictions", str(cal), "--alpha", "0.2",
                         "--output", str(tmp_path / "cli.jsonl")]) == 0  # fmt: skip
    assert f"wrote {tmp_path / 'cli.png'} (coverage against the target)" in capsys.readouterr().out
    new = _write(tmp_path / "new.jsonl", [{"id": "n1", "prediction": ["a", "b"], "confidence": [0.95, 0.3]}])
    s = conformalize(cal, new, alpha=0.2, output=tmp_path / "o.jsonl")
    assert s["plot"] is None and not (tmp_path / "o.png").exists()
