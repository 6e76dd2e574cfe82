"""AnswerSelector's conditions: fresh tie-break draws for every seed, a warning when calibration and test lists
differ in length, and inputs that a cast would change refused."""

from __future__ import annotations

import logging
import math
import sys
import time

import pytest
import torch

from kglightning.conformal import AnswerSelector, ScoredAnswers, calibration_floor
from kglightning.conformal.functional.selection import kept_rate_pvalues
from kglightning.conformal.functional.two_sample import ks_two_sample, summary
from kglightning.conformal.selection import LENGTH_LEVEL


@pytest.mark.parametrize("rule", ["fdr", "top"])
def test_tie_breaks_keep_the_promise_for_each_seed_over_fresh_data_with_fixed_ids(rule):
    # every score tied, so the tie-break draws decide; the answers' ids (keys) are the same in every data set. A draw
    # that is a function of the seed and the id alone is the same on every data set, and some seeds then keep
    # answers every time (FDR 0.4-0.5 there); drawn from the data too, each seed keeps its bound.
    n, m, seeds, reps = 19, 10, 40, 50
    gen = torch.Generator().manual_seed(0)
    cal_keys, test_keys = [f"c{i}#0" for i in range(n)], [f"t{i}#0" for i in range(m)]
    per_seed = []
    for seed in range(seeds):
        fdp = []
        for _ in range(reps):
            cal_bad, test_bad = torch.rand(n, generator=gen) < 0.5, torch.rand(m, generator=gen) < 0.5
            cal = ScoredAnswers(torch.full((n,), 0.5), torch.arange(n), hallucinated=cal_bad, keys=cal_keys)
            test = ScoredAnswers(torch.full((m,), 0.5), torch.arange(m), keys=test_keys)
            keep = AnswerSelector(rule, 0.1, seed=seed).select(cal, test).keep
            fdp.append(float((keep & test_bad).sum()) / max(int(keep.sum()), 1))
        per_seed.append(sum(fdp) / reps)
    mean = sum(per_seed) / seeds
    assert max(per_seed) <= 0.22, sorted(per_seed)[-5:]  # each seed: 0.1 + 4 standard errors of 50 draws
    assert mean <= 0.1 + 3 * 0.2 / math.sqrt(seeds * reps)


def test_the_same_data_in_another_order_gives_the_same_selection_and_labels_of_the_test_side_do_not_count():
    gen = torch.Generator().manual_seed(1)
    s = torch.round(torch.rand(60, generator=gen) * 4) / 4  # many ties
    bad = torch.rand(60, generator=gen) < s
    keys = [f"q{i // 3}#{i % 3}" for i in range(60)]
    cal = ScoredAnswers(s[:30], torch.arange(30) // 3, hallucinated=bad[:30], keys=keys[:30])
    test = ScoredAnswers(s[30:], torch.arange(30) // 3, keys=keys[30:])
    labelled = ScoredAnswers(s[30:], torch.arange(30) // 3, hallucinated=bad[30:], keys=keys[30:])
    perm = torch.randperm(30, generator=gen)
    shuffled = ScoredAnswers(s[30:][perm], (torch.arange(30) // 3)[perm], keys=[keys[30 + int(i)] for i in perm])
    for rule in ("fdr", "top"):
        sel = AnswerSelector(rule, 0.3, seed=4)
        a, b = sel.select(cal, test).keep, sel.select(cal, shuffled).keep
        assert torch.equal(a[perm], b) and torch.equal(a, sel.select(cal, labelled).keep)


def _lists(gen: torch.Generator, lengths: torch.Tensor) -> ScoredAnswers:
    """Questions with the given list lengths; a third of them wrong throughout, the others' answers wrong half the
    time; wrong answers score higher."""
    q = torch.arange(lengths.numel()).repeat_interleave(lengths)
    bad = (torch.rand(lengths.numel(), generator=gen) < 0.3)[q] | (torch.rand(q.numel(), generator=gen) < 0.5)
    s = torch.randn(q.numel(), generator=gen, dtype=torch.float64) + bad.double()
    return ScoredAnswers(s, q, hallucinated=bad)


def test_lists_of_other_lengths_are_warned_about_with_both_summaries(caplog):
    gen = torch.Generator().manual_seed(2)
    cal = _lists(gen, torch.full((200,), 2))
    test = _lists(gen, torch.full((200,), 10))
    with caplog.at_level(logging.WARNING, logger="kglightning.conformal.selection"):
        sel = AnswerSelector("top", 0.1).select(cal, test)
    info = sel.groups["all"]
    assert info.length_pvalue < 1e-10 and info.calibration_lengths["mean"] == 2 and info.test_lengths["max"] == 10
    text = caplog.text
    assert "answer lists of different lengths (two-sample Kolmogorov-Smirnov p = " in text
    assert "calibration 200 questions, 2.00 answers on average (quartiles 2/2/2, range 2-2)" in text
    assert "test 200 questions, 10.00 answers on average (quartiles 10/10/10, range 10-10)" in text
    # the same lengths' distribution on both sides: no warning
    caplog.clear()
    alike = [_lists(gen, torch.randint(1, 11, (200,), generator=gen)) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="kglightning.conformal.selection"):
        sel = AnswerSelector("top", 0.1).select(alike[0], alike[1])
    assert sel.groups["all"].length_pvalue >= 0.01 and "different lengths" not in caplog.text
    # and not over random splits of one pool (check_lengths=False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kglightning.conformal.selection"):
        sel = AnswerSelector("top", 0.1).select(cal, test, check_lengths=False)
    assert sel.groups["all"].length_pvalue is None and "different lengths" not in caplog.text


def test_the_length_test_keeps_its_level_on_counts_and_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    gen = torch.Generator().manual_seed(3)
    rejected = 0
    for _ in range(1000):  # one distribution of list lengths on both sides: the warning's false alarm rate
        lengths = torch.poisson(torch.full((2, 60), 3.0), generator=gen) + 1
        rejected += ks_two_sample(lengths[0], lengths[1])[1] < 0.01
    assert rejected <= 20  # at most 1% (+ 3.3 standard errors); counts with ties make it conservative
    for n, m in ((40, 70), (9, 13), (1, 4), (150, 120)):  # the exact p-value of scipy
        x, y = torch.randint(1, 8, (n,), generator=gen), torch.randint(2, 12, (m,), generator=gen)
        d, p = ks_two_sample(x, y)
        want = stats.ks_2samp(x.numpy(), y.numpy(), method="exact")
        assert d == pytest.approx(want.statistic) and p == pytest.approx(want.pvalue, rel=1e-9)
    assert ks_two_sample([], [1, 2]) == (0.0, 1.0) and summary([])["n"] == 0


@pytest.mark.parametrize("n", [20, 50, 100])
def test_the_length_test_warns_at_most_at_its_level_on_continuous_lengths(n):
    # the rate at which one continuous distribution on both sides is warned about, computed exactly: the
    # probability of the smallest D that the test rejects at LENGTH_LEVEL (with n = m, D is a multiple of 1 / n,
    # and x, x + k have D = k / n). The asymptotic p-value with Stephens' correction warned 1.23% at 20, 1.15% at 50.
    stats = pytest.importorskip("scipy.stats")
    x = torch.arange(n, dtype=torch.float64)
    k = next(k for k in range(1, n + 1) if ks_two_sample(x, x + k)[1] < LENGTH_LEVEL)
    rate = stats.ks_2samp(x.numpy(), (x + k).numpy(), method="exact").pvalue  # P(D >= k / n)
    assert rate <= LENGTH_LEVEL
    assert ks_two_sample(x, x + k - 1)[1] >= LENGTH_LEVEL  # and it rejects as soon as the exact p-value allows
    assert stats.ks_2samp(x.numpy(), (x + k - 1).numpy(), method="exact").pvalue > LENGTH_LEVEL


def test_inputs_a_cast_would_change_are_refused():
    with pytest.raises(ValueError, match=r"hallucinated must hold booleans or 0/1 .* got 0\.3"):
        ScoredAnswers(torch.zeros(3), torch.arange(3), hallucinated=[0.3, float("nan"), 0.0])
    with pytest.raises(ValueError, match="hallucinated must hold booleans or 0/1 .* got nan"):
        ScoredAnswers(torch.zeros(2), torch.arange(2), hallucinated=[1.0, float("nan")])
    with pytest.raises(ValueError, match=r"question must hold integer ids, got 1\.2"):
        ScoredAnswers(torch.zeros(2), [1.2, 1.7])
    with pytest.raises(ValueError, match="integer ids, got booleans"):
        ScoredAnswers(torch.zeros(2), [True, False])
    # whole floats outside int64 wrapped to one id in the cast, and merged distinct questions
    for ids in ([1e19, 2e19], [2.0**63, 1.0], torch.tensor([-1e30, 0.0], dtype=torch.float64)):
        with pytest.raises(ValueError, match=r"integer ids in \[-2\*\*63, 2\*\*63\), got"):
            ScoredAnswers(torch.zeros(2), ids)
    with pytest.raises(ValueError, match=r"below 2\*\*63"):
        ScoredAnswers(torch.zeros(2), torch.tensor([2**63 + 5, 1], dtype=torch.uint64))
    with pytest.raises(ValueError, match="fit in 64 bits"):
        ScoredAnswers(torch.zeros(2), [2**64, 1])
    assert ScoredAnswers(torch.zeros(2), [-(2.0**63), 2.0**62]).question.tolist() == [-(2**63), 2**62]
    assert ScoredAnswers(torch.zeros(2), [16777217.0, 16777216.0]).question.tolist() == [16777217, 16777216]
    ok = ScoredAnswers(torch.zeros(3), [1.0, 2.0, 2.0], hallucinated=[1, 0, 1.0])
    assert ok.question.tolist() == [1, 2, 2] and ok.hallucinated.tolist() == [True, False, True]


def test_grouped_calibration_with_ungrouped_test_answers_is_an_error():
    cal = ScoredAnswers(torch.rand(20), torch.arange(20), ["a"] * 20, torch.zeros(20, dtype=torch.bool))
    bare = ScoredAnswers(torch.rand(20), torch.arange(20), hallucinated=torch.zeros(20, dtype=torch.bool))
    with pytest.raises(ValueError, match="the calibration answers have groups and the test answers have none"):
        AnswerSelector("question", 0.2).select(cal, bare)
    with pytest.raises(ValueError, match="the test answers have groups and the calibration answers have none"):
        AnswerSelector("question", 0.2).select(bare, cal)


def _clustered(gen: torch.Generator, questions: int, answers: int = 10) -> ScoredAnswers:
    """Whole questions right or wrong (30% wrong), an uninformative score shared by a question's answers."""
    q = torch.arange(questions).repeat_interleave(answers)
    wrong = (torch.rand(questions, generator=gen) < 0.3)[q]
    s = torch.sigmoid(
        torch.randn(questions, generator=gen, dtype=torch.float64)[q]
        + 0.05 * torch.randn(q.numel(), generator=gen, dtype=torch.float64)
    )
    return ScoredAnswers(s, q, hallucinated=wrong)


def test_fdr_counts_calibration_questions_and_flags_answers_that_cluster(caplog):
    gen = torch.Generator().manual_seed(5)
    # 8 calibration questions (one below the floor) of 10 answers each: 80 answers passed fdr's floor of 9 and kept
    # answers with an FDR near 0.25 at alpha 0.1; counted as questions they are too few (a floor one lower fails)
    fdp = []
    for seed in range(300):
        cal, test = _clustered(gen, 8), _clustered(gen, 50)
        keep = AnswerSelector("fdr", 0.1, seed=seed).select(cal, ScoredAnswers(test.scores, test.question)).keep
        fdp.append(float((keep & test.hallucinated).sum()) / max(int(keep.sum()), 1))
    assert sum(fdp) / len(fdp) <= 0.1 + 3 * 0.3 / math.sqrt(len(fdp))
    cal, test = _clustered(gen, 5), _clustered(gen, 50)
    with caplog.at_level(logging.WARNING, logger="kglightning.conformal.selection"):
        info = AnswerSelector("fdr", 0.1).select(cal, test).groups["all"]
    assert info.too_small and info.n_calibration == 5 and info.min_calibration == 9 and info.n_kept == 0
    assert "has 5 calibration questions (50 answers), fewer than the 9" in caplog.text
    # enough questions, but several answers each: kept, flagged and warned about (the bound can fail there)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kglightning.conformal.selection"):
        info = AnswerSelector("fdr", 0.1).select(_clustered(gen, 20), test).groups["all"]
    assert info.clustered and not info.too_small and info.n_calibration == 20
    assert "calibration 200 answers in 20 questions, test 500 in 50 (up to 10 per question)" in caplog.text
    assert "rule 'fdr' assumes the answers exchangeable one by one" in caplog.text and "Rule 'top'" in caplog.text
    caplog.clear()  # once only when asked: sweeps warn once themselves
    with caplog.at_level(logging.WARNING, logger="kglightning.conformal.selection"):
        assert (
            AnswerSelector("fdr", 0.1).select(_clustered(gen, 20), test, warn_clustered=False).groups["all"].clustered
        )
    assert "exchangeable one by one" not in caplog.text
    # one answer per question on both sides: what fdr assumes, no flag; the other rules are not flagged at all
    single, single_test = _clustered(gen, 30, answers=1), _clustered(gen, 30, answers=1)
    with caplog.at_level(logging.WARNING, logger="kglightning.conformal.selection"):
        assert AnswerSelector("fdr", 0.1).select(single, single_test).groups["all"].clustered is False
        assert AnswerSelector("top", 0.1).select(cal, test).groups["all"].clustered is None
    assert "exchangeable one by one" not in caplog.text


@pytest.mark.timeout(60)  # counting up from 1 never ended at alpha 1e-300
def test_a_tiny_alpha_gives_its_floor_at_once():
    start = time.perf_counter()
    assert calibration_floor("top", 1e-5, 0.1) == 99990 and calibration_floor("question", 1e-300, 0.1) > 9 * 10**8
    assert calibration_floor("kept_rate", 5e-324, 0.1) == sys.maxsize  # one bet cannot grow the wealth
    info = AnswerSelector("top", 1e-300).select(
        _clustered(torch.Generator().manual_seed(6), 20), ScoredAnswers([0.1], [0])
    )
    assert info.groups["all"].too_small and time.perf_counter() - start < 2.0  # the count up took 6 s at 1e-5


def test_kept_rate_does_not_depend_on_the_order_or_the_ids_of_the_calibration_questions():
    gen = torch.Generator().manual_seed(7)

    def rows(n: int, prefix: str) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
        out = []
        for i in range(n):  # whole questions wrong, and the scores say so
            m, wrong = int(torch.randint(1, 9, (1,), generator=gen)), bool(torch.rand(1, generator=gen) < 0.3)
            s = torch.sigmoid(torch.randn(1, generator=gen) + 3 * wrong + 0.05 * torch.randn(m, generator=gen))
            out.append((f"{prefix}{i}", s.double(), torch.full((m,), wrong)))
        return out

    def scored(rs, labels: bool = True) -> ScoredAnswers:  # as read_scored builds it: question = row index
        q = torch.cat([torch.full((len(s),), k) for k, (_, s, _) in enumerate(rs)])
        keys = [f"{i}#{j}" for i, s, _ in rs for j in range(len(s))]
        y = torch.cat([y for *_, y in rs]) if labels else None
        return ScoredAnswers(torch.cat([s for _, s, _ in rs]), q, None, y, keys)

    cal, test = rows(300, "c"), rows(100, "t")
    shuffled = [cal[int(i)] for i in torch.randperm(len(cal), generator=gen)]
    sel = AnswerSelector("kept_rate", 0.3, seed=0)
    a, b = sel.select(scored(cal), scored(test, False)), sel.select(scored(shuffled), scored(test, False))
    assert a.groups["all"].cut is not None and a.groups["all"].cut == b.groups["all"].cut
    assert torch.equal(a.keep, b.keep)  # the file in another order kept 355 answers instead of 378
    # the p-values themselves: the same questions under other ids, in another order, with the same seed
    c = scored(cal)
    ids = torch.randperm(300, generator=gen) * 7 + 5
    perm = torch.randperm(len(c), generator=gen)
    t = torch.linspace(0.2, 1.0, 9, dtype=torch.float64)
    p1, r1 = kept_rate_pvalues(c.scores, c.hallucinated, c.question, t, 0.3, generator=torch.Generator().manual_seed(1))
    p2, r2 = kept_rate_pvalues(
        c.scores[perm], c.hallucinated[perm], ids[c.question][perm], t, 0.3, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(p1, p2) and torch.allclose(r1, r2)
