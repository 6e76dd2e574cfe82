"""The summaries and tables of test metrics over folds and seeds, without training anything."""

from __future__ import annotations

import statistics

import pytest

from kglightning.metrics.cv_table import (
    compare_scorers,
    comparison_table,
    progress_line,
    scorer_of,
    summarize_folds,
    summarize_seeds,
    summary_table,
)


def _run(detector: float, structural: float, random: float) -> dict[str, float]:
    return {
        "test/f1": detector, "test/auc_pr": detector + 0.05, "test/all/f1": detector - 0.01,
        "test/all/auc_pr": detector, "test/all/auroc": detector + 0.1,
        "test/structural/f1": structural, "test/all/structural/f1": structural,
        "test/random/f1": random, "test/all/random/f1": random, "test/all/random/auroc": 0.5,
        "test/all/llm_judge/f1": 0.4, "test/loss": 0.3, "best/val/auc_pr": 0.8,
    }  # fmt: skip


# folds 0..2, seeds 0..1: the detector beats structural in folds 0 and 2, loses in fold 1
RUNS = {
    "0": {"0": _run(0.70, 0.60, 0.5), "1": _run(0.72, 0.60, 0.5)},
    "1": {"0": _run(0.55, 0.65, 0.5), "1": _run(0.57, 0.65, 0.5)},
    "2": {"0": _run(0.80, 0.70, 0.5), "1": _run(0.82, 0.70, 0.5)},
}


@pytest.mark.parametrize(
    "name, expected",
    [
        ("test/f1", ("detector", "f1")),
        ("test/all/auroc", ("detector", "all/auroc")),
        ("test/all/structural/auc_pr", ("structural", "all/auc_pr")),
        ("test/mostfrequent/f1", ("mostfrequent", "f1")),
        ("test/precision", None),
        ("test/threshold", None),
        ("val/f1", None),
        ("best/val/auc_pr", None),
        ("test/all/a/b/f1", None),
    ],
)
def test_metric_names_give_scorer_and_column(name, expected):
    assert scorer_of(name) == expected


def test_fold_summary_separates_the_spread_across_folds_from_the_spread_across_seeds():
    summary, fold_means = summarize_folds(RUNS)
    f1 = summary["test/f1"]
    means = [0.71, 0.56, 0.81]
    assert fold_means["test/f1"] == pytest.approx({"0": 0.71, "1": 0.56, "2": 0.81})
    assert f1["mean"] == pytest.approx(statistics.fmean(means))
    assert f1["std"] == pytest.approx(statistics.stdev(means))
    every = [r["test/f1"] for g in RUNS.values() for r in g.values()]
    assert f1["std_runs"] == pytest.approx(statistics.stdev(every))
    assert f1["std_seeds"] == pytest.approx(statistics.stdev([0.70, 0.72]))  # the same within every fold
    assert f1["runs"] == 6
    table = summary_table(summary, fold_means, label="3 folds x seeds 0, 1")
    assert table.splitlines()[0].startswith("| metric | mean ± std over folds (3 folds x seeds 0, 1) |")
    assert "| test/f1 | 0.6933 ± 0.1258 |" in table and table.count("\n") == len(summary) + 1


def test_a_metric_missing_from_one_run_is_left_out():
    runs = {"0": {"0": {"a": 1.0, "b": 2.0}}, "1": {"0": {"a": 3.0}}}
    summary, _ = summarize_folds(runs)
    assert list(summary) == ["a"]
    assert list(summarize_seeds({"0": {"a": 1.0, "b": 2.0}, "1": {"a": 3.0}})) == ["a"]


def test_seed_summary_is_the_mean_and_sample_std():
    s = summarize_seeds({"0": {"test/f1": 0.5}, "1": {"test/f1": 0.9}, "2": {"test/f1": 0.7}})
    assert s["test/f1"]["mean"] == pytest.approx(0.7) and s["test/f1"]["std"] == pytest.approx(0.2)
    assert summarize_seeds({"0": {"test/f1": 0.5}})["test/f1"]["std"] == 0.0
    assert summary_table(s, label="seeds 0, 1, 2").splitlines()[2] == "| test/f1 | 0.7000 | 0.2000 |"


def test_comparison_puts_the_detector_first_and_counts_the_folds_it_wins():
    c = compare_scorers(RUNS, unit="folds")
    assert list(c["scores"]) == ["detector", "structural", "random", "llm_judge"]
    assert set(c["scores"]["detector"]) == {"all/f1", "all/auc_pr", "all/auroc", "f1", "auc_pr"}
    assert set(c["scores"]["random"]) == {"all/f1", "all/auroc", "f1"}
    assert c["scores"]["detector"]["f1"]["mean"] == pytest.approx(statistics.fmean([0.71, 0.56, 0.81]))
    diff = c["differences"]["structural"]["f1"]
    assert diff["mean"] == pytest.approx(statistics.fmean([0.11, -0.09, 0.11]))
    assert diff["positive"] == 2 and c["groups"] == 3
    assert c["differences"]["random"]["all/auroc"]["positive"] == 3
    table = comparison_table(c)
    lines = table.splitlines()
    assert lines[0] == "| scorer | all/f1 | all/auc_pr | all/auroc | f1 | auc_pr |"
    assert lines[2].startswith("| detector | 0.683 ± ")
    assert "| detector - structural | +0.033 (2/3 folds) |" in table
    assert "| detector - llm_judge |" in table
    assert "(3/3 folds)" in lines[-2]  # random: the detector is above it in every fold


def test_comparison_without_folds_counts_seeds():
    runs = {s: {s: _run(0.7 + 0.05 * int(s), 0.72, 0.5)} for s in ("0", "1", "2")}
    c = compare_scorers(runs, unit="seeds")
    assert c["differences"]["structural"]["f1"]["positive"] == 2  # seeds 1 and 2
    assert "(2/3 seeds)" in comparison_table(c)


def test_comparison_of_metrics_without_scorers_says_so():
    assert comparison_table(compare_scorers({"0": {"0": {"test/loss": 1.0}}})).startswith("(no test metric")


def test_progress_line_shows_the_headline_metrics():
    line = progress_line("fold 2/5, seed 0", RUNS["0"]["0"])
    assert line == ("fold 2/5, seed 0: test/all/f1 0.6900, test/all/auc_pr 0.7000, test/f1 0.7000, test/auc_pr "
                    "0.7500, best/val/auc_pr 0.8000")  # fmt: skip
    assert progress_line("seed 1", {"test/acc": 0.5, "test/hit": 0.25}) == "seed 1: test/acc 0.5000, test/hit 0.2500"


def test_differences_average_group_means_as_the_scores_do_and_nan_runs_do_not_crash():
    """Found by a review: with unequal seeds per fold the difference row was a mean over runs while the score rows
    were means of fold means (0.700 and 0.600 with a difference of +0.250); a NaN metric crashed stdev."""
    from kglightning.metrics.cv_table import compare_scorers, summarize_folds

    runs = {"0": {"0": {"test/f1": 0.9, "test/random/f1": 0.5}, "1": {"test/f1": 0.9, "test/random/f1": 0.5},
                  "2": {"test/f1": 0.9, "test/random/f1": 0.5}},
            "1": {"0": {"test/f1": 0.5, "test/random/f1": 0.7}}}  # fmt: skip
    c = compare_scorers(runs)
    det, rnd = c["scores"]["detector"]["f1"]["mean"], c["scores"]["random"]["f1"]["mean"]
    assert c["differences"]["random"]["f1"]["mean"] == pytest.approx(det - rnd)
    for group in runs.values():
        for run in group.values():
            run["test/loss"] = 0.3
    runs["1"]["0"]["test/loss"] = float("nan")
    summary, _ = summarize_folds(runs)  # no error; the NaN shows
    assert (
        summary["test/f1"]["mean"] == pytest.approx(0.7) and summary["test/loss"]["std"] != summary["test/loss"]["std"]
    )
