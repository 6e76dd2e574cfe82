"""The run log of ``kglightning seeds``: written after every run, resumed only with the same arguments."""

from __future__ import annotations

import json

import pytest

from kglightning.metrics.cv_runs import RunLog, config_arguments


def _metrics(x: float) -> dict[str, float]:
    return {"test/f1": x, "test/all/f1": x, "test/structural/f1": 0.5, "test/all/structural/f1": 0.5}


def test_every_run_is_written_as_it_ends(tmp_path):
    path = tmp_path / "cv.json"
    log = RunLog({"seeds": [0, 1], "folds": 2}, path)
    assert log.pairs() == [(0, 0), (0, 1), (1, 0), (1, 1)]
    log.add(0, 0, _metrics(0.6))
    stored = json.loads(path.read_text())
    assert stored["runs"] == {"0": {"0": _metrics(0.6)}} and stored["complete"] is False
    assert stored["summary"]["test/f1"]["mean"] == pytest.approx(0.6)
    for fold, seed in log.pending():
        log.add(fold, seed, _metrics(0.6 + 0.1 * fold + 0.01 * seed))
    stored = json.loads(path.read_text())
    assert stored["complete"] is True and set(stored["runs"]) == {"0", "1"}
    assert stored["fold_means"]["test/f1"] == pytest.approx({"0": 0.605, "1": 0.705})
    assert stored["comparison"]["differences"]["structural"]["f1"]["positive"] == 2


def test_without_folds_the_runs_are_kept_per_seed(tmp_path):
    log = RunLog({"seeds": [3, 4], "folds": None}, tmp_path / "s.json")
    log.add(None, 3, _metrics(0.7))
    log.add(None, 4, _metrics(0.9))
    stored = json.loads((tmp_path / "s.json").read_text())
    assert set(stored["seeds"]) == {"3", "4"} and "runs" not in stored and "fold_means" not in stored
    assert stored["summary"]["test/f1"] == pytest.approx({"mean": 0.8, "std": 0.1414213562})
    assert stored["comparison"]["unit"] == "seeds" and stored["comparison"]["groups"] == 2


def test_resume_skips_the_runs_done_and_keeps_them(tmp_path):
    path = tmp_path / "cv.json"
    args = config_arguments([], ["--trainer.max_epochs", "2"], folds=2, seeds=[0])
    log = RunLog(args, path)
    log.add(0, 0, _metrics(0.6))
    again = RunLog.resume(path, args)
    assert again.has(0, 0) and again.pending() == [(1, 0)]
    more = RunLog.resume(path, {**args, "seeds": [0, 1]})  # more seeds: the same runs, more to do
    assert more.pending() == [(0, 1), (1, 0), (1, 1)]
    assert RunLog.resume(tmp_path / "none.json", args).pending() == [(0, 0), (1, 0)]  # no file yet: start afresh


def test_resume_refuses_other_arguments(tmp_path):
    path = tmp_path / "cv.json"
    config = tmp_path / "c.yaml"
    config.write_text("trainer: {max_epochs: 2}\n")
    args = config_arguments([str(config)], ["--trainer.max_epochs", "2"], folds=2, seeds=[0], fold_pool=None)
    RunLog(args, path).add(0, 0, _metrics(0.6))
    with pytest.raises(ValueError, match=r"other arguments \(overrides: stored \['--trainer.max_epochs', '2'\], now"):
        RunLog.resume(path, {**args, "overrides": ["--trainer.max_epochs", "3"]})
    with pytest.raises(ValueError, match="folds: stored 2, now 3"):
        RunLog.resume(path, {**args, "folds": 3})
    with pytest.raises(ValueError, match="fold_pool: stored None, now"):
        RunLog.resume(path, {**args, "fold_pool": ["train", "validation"]})
    config.write_text("trainer: {max_epochs: 5}\n")  # the config file was edited
    with pytest.raises(ValueError, match="config_sha1"):
        RunLog.resume(path, config_arguments([str(config)], ["--trainer.max_epochs", "2"], folds=2, seeds=[0],
                                             fold_pool=None))  # fmt: skip
    path.write_text(json.dumps({"seeds": {"0": {}}, "summary": {}}))  # written before --resume existed
    with pytest.raises(ValueError, match="no stored arguments"):
        RunLog.resume(path, args)


def test_outputs_are_the_json_the_tables_and_the_plot(tmp_path):
    log = RunLog({"seeds": [0], "folds": 2}, tmp_path / "cv.json")
    log.add(0, 0, _metrics(0.6))
    log.add(1, 0, _metrics(0.8))
    files = log.write_outputs(title="detector")
    assert [f.name for f in files] == ["cv.json", "cv.md", "cv.png"]
    md = (tmp_path / "cv.md").read_text()
    assert "| test/f1 | 0.7000 ± 0.1414 |" in md and "| detector - structural | +0.200 (2/2 folds) |" in md
    assert log.label() == "2 folds x seeds 0"
    assert files[2].read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="no path"):
        RunLog({"seeds": [0], "folds": None}).write_outputs()
