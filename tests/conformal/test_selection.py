"""Tests for kglightning.conformal.selection.AnswerSelector: per-group (Mondrian) guarantees by simulation, the
flagged small groups, abstention with a warning, seeded ties and input errors."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

from kglightning.conformal import AnswerSelector, ScoredAnswers, calibration_floor
from kglightning.metrics.functional import grouped_selection_metrics, selection_metrics


def draw(gen: torch.Generator, questions: int, first: int = 0) -> ScoredAnswers:
    """Two groups that differ: "easy" answers are 10% hallucinated and well separated, "hard" ones 60% and not."""
    sizes = torch.randint(1, 5, (questions,), generator=gen)
    q = torch.repeat_interleave(torch.arange(first, first + questions), sizes)
    hard = torch.rand(q.numel(), generator=gen) < 0.4
    bad = torch.rand(q.numel(), generator=gen) < torch.where(hard, 0.6, 0.1)
    u = torch.rand(q.numel(), generator=gen, dtype=torch.float64)
    s = torch.where(bad, 0.5 + 0.5 * u, 0.7 * u)
    s = torch.where(hard, 0.3 + 0.4 * u, s)  # the hard group's scores say nothing
    return ScoredAnswers(s, q, ["hard" if h else "easy" for h in hard.tolist()], bad)


@pytest.mark.parametrize("rule", ["fdr", "question"])
def test_each_group_keeps_its_guarantee(rule):
    gen = torch.Generator().manual_seed(11)
    per_group = {"easy": [], "hard": []}
    pooled_hard = []
    sel = AnswerSelector(rule=rule, alpha=0.2, seed=0)
    for _ in range(300):
        cal, test = draw(gen, 150), draw(gen, 60, first=1000)
        out = sel.select(cal, test)
        m = grouped_selection_metrics(out.keep, test.hallucinated, test.question, test.group)
        key = "fdr" if rule == "fdr" else "question_error"
        for g in per_group:
            per_group[g].append(m[g][key])
        pooled = sel.select(
            ScoredAnswers(cal.scores, cal.question, None, cal.hallucinated), ScoredAnswers(test.scores, test.question)
        )
        mask = torch.tensor([g == "hard" for g in test.group])
        pooled_hard.append(selection_metrics(pooled.keep[mask], test.hallucinated[mask], test.question[mask])[key])
    for g, vals in per_group.items():
        assert np.mean(vals) <= 0.2 + 3 * np.std(vals) / math.sqrt(len(vals)), (g, np.mean(vals))
    # calibrating both groups together breaks the hard group's rate: the reason for Mondrian groups
    assert np.mean(pooled_hard) > 0.2 + 3 * np.std(pooled_hard) / math.sqrt(len(pooled_hard))


def test_kept_rate_rule_holds_per_group_and_keeps_the_easy_answers():
    gen = torch.Generator().manual_seed(12)
    sel = AnswerSelector(rule="kept_rate", alpha=0.15, delta=0.1, start=0.2)
    violations, easy_power = 0, []
    for _ in range(200):
        cal, test = draw(gen, 300), draw(gen, 100, first=1000)
        out = sel.select(cal, test)
        cut = out.groups["easy"].cut
        if cut is not None:  # the true kept rate of the easy group at this cut, from its known distribution
            p_bad, p_ok = 0.1 * max(0.0, (cut - 0.5) / 0.5), 0.9 * min(1.0, cut / 0.7)
            violations += p_bad / (p_bad + p_ok) > 0.15
        m = grouped_selection_metrics(out.keep, test.hallucinated, test.question, test.group)
        easy_power.append(m["easy"]["power"])
        assert out.groups["hard"].n_kept == 0 or out.groups["hard"].cut is not None
    assert violations / 200 <= 0.1 + 3 * math.sqrt(0.09 / 200)
    assert np.mean(easy_power) > 0.8


def test_small_group_is_flagged_keeps_nothing_and_warns(caplog):
    gen = torch.Generator().manual_seed(13)
    cal, test = draw(gen, 200), draw(gen, 50, first=1000)
    few = [i for i, g in enumerate(cal.group) if g == "hard"][:5]
    keep = torch.ones(len(cal), dtype=torch.bool)
    keep[[i for i, g in enumerate(cal.group) if g == "hard" and i not in few]] = False
    small = ScoredAnswers(
        cal.scores[keep], cal.question[keep], [g for g, k in zip(cal.group, keep) if k], cal.hallucinated[keep]
    )
    with caplog.at_level(logging.WARNING):
        out = AnswerSelector(rule="fdr", alpha=0.1).select(small, test)
    hard = out.groups["hard"]
    assert hard.too_small and hard.n_calibration == 5 and hard.min_calibration == 9
    assert not out.keep[torch.tensor([g == "hard" for g in test.group])].any()
    assert out.groups["easy"].n_kept > 0 and not out.groups["easy"].too_small
    assert "'hard' has 5 calibration answers" in caplog.text
    # a group that only the test split has is flagged too
    out = AnswerSelector(rule="fdr", alpha=0.1).select(small, ScoredAnswers([0.1], [0], ["new"]))
    assert out.groups["new"].too_small and out.groups["new"].n_calibration == 0 and not out.keep.any()


def test_unreachable_alpha_abstains_with_a_warning(caplog):
    gen = torch.Generator().manual_seed(14)
    cal, test = draw(gen, 100), draw(gen, 30, first=1000)
    hard = ScoredAnswers(test.scores, test.question, None)
    calh = ScoredAnswers(cal.scores, cal.question, None, torch.ones(len(cal), dtype=torch.bool))  # all wrong
    for rule, alpha, message in (("fdr", 0.05, "keeps none"), ("kept_rate", 0.1, "keeps none"),
                                 ("kept_rate", 0.05, "fewer than the 143"), ("question", 0.005, "fewer than the 199")):  # fmt: skip
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            out = AnswerSelector(rule=rule, alpha=alpha).select(calh, hard)
        assert not out.keep.any() and message in caplog.text
        assert selection_metrics(out.keep, test.hallucinated, test.question)["abstention"] == 1.0


def test_ties_are_broken_by_the_seed():
    # every test score ties with the 20 hallucinated calibration scores: which answers BH keeps rests on the draws
    cal = ScoredAnswers(torch.cat([torch.full((20,), 0.5), torch.full((980,), 0.1)]), torch.arange(1000), None,
                        torch.arange(1000) < 20)  # fmt: skip
    test = ScoredAnswers(torch.full((50,), 0.5), torch.arange(50))
    keeps = [AnswerSelector(alpha=0.02, seed=s).select(cal, test).keep for s in range(6)]
    assert torch.equal(keeps[0], AnswerSelector(alpha=0.02, seed=0).select(cal, test).keep)
    assert len({tuple(k.tolist()) for k in keeps}) > 1


def test_calibration_floor_and_arguments():
    assert calibration_floor("fdr", 0.1, 0.1) == 9 and calibration_floor("question", 0.2, 0.5) == 4
    n = calibration_floor("kept_rate", 0.1, 0.05)
    growth = 1 + 0.5 * 0.1 / 0.9  # the best bet's wealth factor per question that keeps all, none wrong
    assert growth**n >= 1 / 0.05 > growth ** (n - 1)
    with pytest.raises(ValueError, match="rule"):
        AnswerSelector(rule="bh")
    with pytest.raises(ValueError, match="alpha"):
        AnswerSelector(alpha=1.0)
    with pytest.raises(ValueError, match=">= 9"):
        AnswerSelector(min_calibration=3)
    with pytest.raises(ValueError, match="labels"):
        AnswerSelector().select(ScoredAnswers([0.1], [0]), ScoredAnswers([0.1], [0]))
    with pytest.raises(ValueError, match="finite"):
        ScoredAnswers([float("nan")], [0])
    with pytest.raises(ValueError, match="group has 1 entries for 2"):
        ScoredAnswers([0.1, 0.2], [0, 1], ["a"])


def test_fdr_selection_with_keys_does_not_depend_on_the_order_of_the_test_answers():
    """As after a DDP gather: the same answers in another order keep the same set when each answer's tie-break is
    drawn from its name; drawn in order from the seed, the kept set can change."""
    gen = torch.Generator().manual_seed(21)
    cal, test = draw(gen, 200), draw(gen, 40, first=1000)
    keys = [f"q{int(q)}#{i}" for i, q in enumerate(test.question.tolist())]
    perm = torch.randperm(len(test), generator=gen)
    moved = ScoredAnswers(test.scores[perm], test.question[perm], [test.group[i] for i in perm.tolist()],
                          test.hallucinated[perm], [keys[i] for i in perm.tolist()])  # fmt: skip
    keyed = ScoredAnswers(test.scores, test.question, test.group, test.hallucinated, keys)
    for seed in range(10):
        a = AnswerSelector(alpha=0.3, seed=seed).select(cal, keyed).keep
        b = AnswerSelector(alpha=0.3, seed=seed).select(cal, moved).keep
        assert torch.equal(a[perm], b)
    draws = keyed.draws(5, torch.ones(len(test), dtype=torch.bool))
    assert torch.equal(draws[perm], moved.draws(5, torch.ones(len(test), dtype=torch.bool)))
    assert 0 <= float(draws.min()) and float(draws.max()) < 1 and draws.unique().numel() == len(test)


def test_kept_rate_floor_counts_the_chains_and_with_alpha_follows_the_floor():
    """The floor is where the best case (every calibration question keeps all, none wrong) can first be certified."""
    floor = calibration_floor("kept_rate", 0.1, 0.1, chains=4)
    for n, kept in ((floor - 1, False), (floor, True)):
        cal = ScoredAnswers(torch.full((n,), 0.05), torch.arange(n), None, torch.zeros(n, dtype=torch.bool))
        out = AnswerSelector(rule="kept_rate", alpha=0.1, chains=4).select(cal, ScoredAnswers([0.1] * 30, range(30)))
        assert out.groups["all"].too_small is not kept and bool(out.keep.any()) is kept
    sel = AnswerSelector(rule="fdr", alpha=0.1, min_calibration=10)
    assert sel.with_alpha(0.05).min_calibration == calibration_floor("fdr", 0.05, 0.1)  # raised to the new floor
    assert sel.with_alpha(0.2).min_calibration == 10


def test_the_group_name_all_is_reserved():
    with pytest.raises(ValueError, match="reserved"):
        ScoredAnswers([0.1, 0.2], [0, 1], ["all", "x"])
