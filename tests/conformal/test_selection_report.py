"""The ``--pool`` report's verdict on ``kept_rate``: the promise is on the population rate of the chosen cut, and the
report reads it over the pool the splits draw from, not over one finite test split."""

from __future__ import annotations

import math

import torch

from kglightning.conformal import AnswerSelector, ScoredAnswers
from kglightning.conformal.functional import kept_rate_pvalues
from kglightning.conformal.selection_report import population_rates, repeated_selection, report_markdown, summarize

ALPHA, DELTA, SPLITS = 0.1, 0.1, 30


def _pool(questions: int, answers: int = 5, seed: int = 0) -> ScoredAnswers:
    """A fifth of the questions wrong throughout, the others' answers wrong 30% of the time; wrong answers score
    1.5 higher on average."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.arange(questions).repeat_interleave(answers)
    bad = (torch.rand(questions, generator=gen) < 0.2)[q] | (torch.rand(q.numel(), generator=gen) < 0.3)
    s = torch.randn(q.numel(), generator=gen, dtype=torch.float64) + 1.5 * bad.double()
    return ScoredAnswers(s, q, hallucinated=bad)


def _kept_rate(summary):
    (cell,) = [c for c in summary if c["rule"] == "kept_rate"]
    return cell


def test_a_small_test_split_no_longer_breaks_a_promise_the_cut_keeps():
    # 98.5% of the questions calibrate: the cut's rate over the pool stays within alpha, while the 30 test
    # questions' own rate exceeds it in about a fifth of the splits (the old verdict read that, and said "broken")
    pool = _pool(2000)
    rows = repeated_selection(pool, ["kept_rate"], [ALPHA], DELTA, SPLITS, calibration_share=0.985, seed=0)
    cell = _kept_rate(summarize(rows, DELTA))
    assert cell["target"] == "population_rate" and cell["holds"] is True and cell["within"] >= 0.9
    kept = [r for r in rows if r["rule"] == "kept_rate"]
    on_test = sum(r["weighted_fdr"] <= ALPHA for r in kept) / len(kept)
    assert on_test < 1 - DELTA - 2 * math.sqrt(DELTA * (1 - DELTA) / SPLITS)  # what the old check read
    text = report_markdown(summarize(rows, DELTA), "t", DELTA)
    assert "over the whole pool, the population the splits draw from" in text and "**broken**" not in text


def test_an_uncertified_cut_is_found_broken(monkeypatch):
    # the cut whose calibration rate is within alpha, without Learn-Then-Test: its rate over the population exceeds
    # alpha about half the time, and the verdict says so
    def empirical_cut(self, cal_s, cal_y, cal_q, test_s, gen, u):
        thresholds = torch.quantile(test_s, torch.linspace(0.05, 1.0, 100, dtype=torch.float64))
        _, rate = kept_rate_pvalues(cal_s, cal_y, cal_q, thresholds, self.alpha)
        ok = (rate <= self.alpha).nonzero()
        cut = float(thresholds[int(ok.max())]) if ok.numel() else None
        keep = test_s <= cut if cut is not None else torch.zeros_like(test_s, dtype=torch.bool)
        return keep, cut

    monkeypatch.setattr(AnswerSelector, "_select_group", empirical_cut)
    rows = repeated_selection(_pool(2000), ["kept_rate"], [ALPHA], DELTA, SPLITS, calibration_share=0.5, seed=0)
    cell = _kept_rate(summarize(rows, DELTA))
    assert cell["holds"] is False and cell["within"] < 0.75


def test_population_rates_apply_each_group_s_cut_to_the_whole_pool():
    pool = ScoredAnswers(
        torch.tensor([0.1, 0.5, 0.9, 0.2, 0.8]), torch.tensor([0, 0, 0, 1, 1]), ["a", "a", "b", "a", "b"],
        torch.tensor([False, True, True, False, True]),
    )  # fmt: skip
    sel = AnswerSelector("kept_rate", 0.2, min_calibration=1000).select(pool, pool)  # too small: no cut, keeps none
    assert population_rates(pool, sel) == {"all": 0.0, "a": 0.0, "b": 0.0}
    sel.groups["a"].cut, sel.groups["b"].cut = 0.5, 0.85  # keeps 0.1, 0.5 (bad), 0.2 | 0.8 (bad)
    rates = population_rates(pool, sel)
    # group a: question 0 keeps 2 of its 2 a-answers, one bad; question 1 keeps its one: (1/2) / (2/2 + 1/1)
    assert rates["a"] == 0.25 and rates["b"] == 1.0
