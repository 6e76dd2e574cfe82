"""Tests for kglightning.conformal.functional.selection: each guarantee by simulation against a known truth, and
each check made to fail by the smallest anti-conservative change (BH p-values without the +1, the answers of a
question taken as independent units, a conformal rank off by one)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kglightning.conformal import (
    benjamini_hochberg,
    betting_pvalue,
    binomial_cdf,
    conformal_pvalues,
    fixed_sequence,
    hoeffding_bentkus_pvalue,
    kept_rate_pvalues,
    question_cutoff,
)


def se(p: float, reps: int) -> float:
    return math.sqrt(p * (1 - p) / reps)


# ---------------------------------------------------------------- conformal p-values and BH


def test_pvalues_match_brute_force_and_are_seeded():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n, m = int(rng.integers(1, 12)), int(rng.integers(1, 6))
        cal = rng.integers(0, 4, n).astype(float)  # many ties
        null = rng.random(n) < 0.6
        test = rng.integers(0, 4, m).astype(float)
        p = conformal_pvalues(
            torch.tensor(cal), torch.tensor(null), torch.tensor(test), torch.Generator().manual_seed(3)
        )
        u = torch.rand(m, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        for j in range(m):
            below = sum(1 for c, z in zip(cal, null) if z and c < test[j])
            ties = sum(1 for c, z in zip(cal, null) if z and c == test[j])
            assert p[j].item() == pytest.approx((below + u[j].item() * (1 + ties)) / (n + 1))
    a = conformal_pvalues(torch.zeros(5), torch.ones(5), torch.zeros(4), torch.Generator().manual_seed(1))
    b = conformal_pvalues(torch.zeros(5), torch.ones(5), torch.zeros(4), torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.unique().numel() == 4  # every tie broken by its own seeded draw


def test_bh_matches_brute_force():
    rng = np.random.default_rng(1)
    for _ in range(300):
        m = int(rng.integers(1, 15))
        p = rng.random(m) ** 2
        alpha = float(rng.choice([0.05, 0.1, 0.2, 0.5]))
        ks = [k for k in range(1, m + 1) if sorted(p)[k - 1] <= alpha * k / m]
        want = p <= (alpha * max(ks) / m if ks else -1)
        assert benjamini_hochberg(torch.tensor(p), alpha).tolist() == want.tolist()
    assert benjamini_hochberg(torch.zeros(0), 0.1).numel() == 0


def _pvalues_without_plus_one(cal, null, test, gen):
    nulls = torch.sort(cal[null]).values
    below = torch.searchsorted(nulls, test)
    ties = torch.searchsorted(nulls, test, right=True) - below
    return (below + torch.rand(test.shape, generator=gen, dtype=torch.float64) * ties) / (cal.numel() + 1)


def _fdr_under_global_null(pvalue_fn, reps: int, n: int = 19, alpha: float = 0.1) -> float:
    """Every answer hallucinated, scores uninformative, one test answer: FDR = P(it is kept), exactly alpha for
    valid p-values when (n + 1) alpha is an integer."""
    gen = torch.Generator().manual_seed(0)
    kept = 0
    for _ in range(reps):
        s = torch.rand(n + 1, generator=gen, dtype=torch.float64)
        p = pvalue_fn(s[:n], torch.ones(n, dtype=torch.bool), s[n:], gen)
        kept += int(benjamini_hochberg(p, alpha).sum())
    return kept / reps


def test_fdr_is_exact_under_the_global_null_and_fails_without_the_plus_one():
    reps = 4000
    fdr = _fdr_under_global_null(conformal_pvalues, reps)
    assert abs(fdr - 0.1) <= 4 * se(0.1, reps)  # tight: the bound is attained
    bad = _fdr_under_global_null(_pvalues_without_plus_one, reps)
    assert bad > 0.1 + 4 * se(0.1, reps)  # (floor(20 * 0.1) + 1) / 20 = 0.15


@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_fdr_holds_with_signal_and_has_power(alpha):
    """Calibration and test answers i.i.d.: 30% hallucinated, with overlapping score distributions."""
    gen = torch.Generator().manual_seed(int(alpha * 100))
    fdps, powers = [], []
    for _ in range(800):

        def draw(k):
            bad = torch.rand(k, generator=gen) < 0.3
            s = torch.where(bad, 0.6 + 0.4 * torch.rand(k, generator=gen), 0.8 * torch.rand(k, generator=gen))
            return s.double(), bad

        cs, cy = draw(100)
        ts, ty = draw(20)
        keep = benjamini_hochberg(conformal_pvalues(cs, cy, ts, gen), alpha)
        fdps.append(float((keep & ty).sum()) / max(int(keep.sum()), 1))
        powers.append(float((keep & ~ty).sum()) / max(int((~ty).sum()), 1))
    assert np.mean(fdps) <= alpha + 3 * np.std(fdps) / math.sqrt(len(fdps))
    assert np.mean(powers) > 0.5


# ---------------------------------------------------------------- kept share per question (Learn-Then-Test)


def test_kept_rate_pvalues_brute_force():
    rng = np.random.default_rng(2)
    for _ in range(100):
        n = int(rng.integers(1, 30))
        cal, null = rng.random(n).round(1), rng.random(n) < 0.4
        q = rng.integers(0, 6, n)
        t = np.array([0.0, 0.3, 0.55, 1.0])
        args = (torch.tensor(cal), torch.tensor(null), torch.tensor(q), torch.tensor(t), 0.2)
        p, rate = kept_rate_pvalues(*args, pvalue="hoeffding_bentkus")
        pb, _ = kept_rate_pvalues(*args, generator=torch.Generator().manual_seed(4))
        for j, tj in enumerate(t):
            losses, bad_w, kept_w = [], 0.0, 0.0
            # the questions in the order of their content (sorted (score, label) pairs), not of their ids
            content = {u: tuple(sorted(zip(cal[q == u].tolist(), null[q == u].tolist()))) for u in np.unique(q)}
            for u in sorted(content, key=content.__getitem__):
                mine = q == u
                kept, m = (cal <= tj) & mine, mine.sum()
                losses.append(min(1.0, max(0.0, 0.2 + ((kept & null).sum() - 0.2 * kept.sum()) / m)))
                bad_w, kept_w = bad_w + (kept & null).sum() / m, kept_w + kept.sum() / m
            assert rate[j].item() == pytest.approx(bad_w / kept_w if kept_w else 0.0)
            assert p[j].item() == pytest.approx(hoeffding_bentkus_pvalue(torch.tensor([losses]), 0.2).item())
            order = torch.Generator().manual_seed(
                int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(4)))
            )
            want = betting_pvalue(torch.tensor([losses]), 0.2, 0.1, order).item()
            assert pb[j].item() == pytest.approx(want)


def test_betting_pvalue_is_valid_at_the_boundary_and_adapts_to_variance():
    gen = torch.Generator().manual_seed(8)
    # losses with mean exactly alpha (a two-point law): rejections at delta happen at most delta of the time
    L = torch.where(torch.rand(4000, 300, generator=gen) < 0.5, 0.05, 0.35).double()
    p = betting_pvalue(L, 0.2, 0.1)
    assert float((p <= 0.1).double().mean()) <= 0.1 + 3 * se(0.1, 4000)
    # small spread, mean 0.17: Hoeffding-Bentkus sees no evidence, betting does
    L = (0.17 + 0.05 * (torch.rand(1, 300, generator=gen) - 0.5)).double()
    assert hoeffding_bentkus_pvalue(L, 0.2).item() > 0.1 and betting_pvalue(L, 0.2).item() < 0.01
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        betting_pvalue(torch.tensor([[1.5]]), 0.2)


def _keep_all_certified(answers_as_units: bool, reps: int, alpha: float = 0.1, delta: float = 0.1) -> float:
    """Questions of 1-8 answers, each question wholly wrong with probability 0.105 > alpha: keeping every answer
    breaks the bound, so certifying it is a violation. ``answers_as_units`` takes every answer for an independent
    unit (the binomial test of kept answers), which the clustering makes overconfident."""
    gen = torch.Generator().manual_seed(5)
    certified = 0
    for _ in range(reps):
        sizes = torch.randint(1, 9, (300,), generator=gen)
        q = torch.repeat_interleave(torch.arange(300), sizes)
        y = (torch.rand(300, generator=gen) < 0.105)[q]
        if answers_as_units:
            p = binomial_cdf(y.sum().double(), y.numel(), alpha).reshape(1)
        else:
            s = torch.rand(q.numel(), generator=gen, dtype=torch.float64)
            p, _ = kept_rate_pvalues(s, y, q, [1.0], alpha, delta=delta, generator=gen)
        certified += bool(fixed_sequence(p, delta).any())
    return certified / reps


def test_ltt_bound_holds_on_clustered_answers_and_fails_with_answers_as_units():
    reps = 1000
    assert _keep_all_certified(False, reps) <= 0.1 + 3 * se(0.1, reps)
    assert _keep_all_certified(True, reps) > 0.1 + 3 * se(0.1, reps)


def test_ltt_over_a_grid_holds_with_a_known_risk_curve():
    """One answer per question, scores uniform, P(hallucinated | s) = s: the rate of a cut t is t / 2."""
    gen = torch.Generator().manual_seed(6)
    grid = torch.linspace(0.1, 1.0, 91, dtype=torch.float64)
    violations, cuts = 0, []
    for _ in range(400):
        s = torch.rand(1000, generator=gen, dtype=torch.float64)
        y = torch.rand(1000, generator=gen, dtype=torch.float64) < s
        p, _ = kept_rate_pvalues(s, y, torch.arange(1000), grid, 0.2, generator=gen)
        valid = fixed_sequence(p, 0.1)
        cut = float(grid[valid.nonzero().max()]) if valid.any() else 0.0
        cuts.append(cut)
        violations += cut / 2 > 0.2 + 1e-12
    assert violations / 400 <= 0.1 + 3 * se(0.1, 400)
    assert np.mean(cuts) > 0.2  # and it keeps something worth keeping (the best cut is 0.4)


# ---------------------------------------------------------------- one guarantee per question


def _question_errors(off_by_one: bool, reps: int, n: int = 19, alpha: float = 0.1) -> float:
    """Questions with 1-4 answers, each hallucinated with probability 0.5, scores uninformative."""
    gen = torch.Generator().manual_seed(7)
    errors = 0
    for _ in range(reps):
        sizes = torch.randint(1, 5, (n + 1,), generator=gen)
        q = torch.repeat_interleave(torch.arange(n + 1), sizes)
        s = torch.rand(q.numel(), generator=gen, dtype=torch.float64)
        y = torch.rand(q.numel(), generator=gen) < 0.5
        cal = q < n
        if off_by_one:
            lowest = torch.full((n,), math.inf, dtype=torch.float64)
            lowest = lowest.scatter_reduce(0, q[cal & y], s[cal & y], "amin")
            cut = float(torch.sort(lowest).values[math.floor((n + 1) * alpha + 1e-9)])  # rank + 1
        else:
            cut = question_cutoff(s[cal], y[cal], q[cal], alpha)
        errors += bool(((s < cut) & y & ~cal).any())
    return errors / reps


def test_question_rule_is_tight_and_fails_off_by_one():
    reps = 4000
    err = _question_errors(False, reps)
    assert err <= 0.1 + 3 * se(0.1, reps)
    assert err >= 0.1 - 6 * se(0.1, reps)  # exactly 2 / 20 for continuous scores (questions with a null answer)
    assert _question_errors(True, reps) > 0.1 + 4 * se(0.1, reps)


def test_question_cutoff_edges():
    # no hallucinated calibration answer: any test question keeps everything
    assert question_cutoff(torch.rand(10), torch.zeros(10, dtype=torch.bool), torch.arange(10), 0.2) == math.inf
    with pytest.raises(ValueError, match="finite"):
        question_cutoff(torch.tensor([float("inf")]), torch.tensor([True]), torch.tensor([0]), 0.2)
    with pytest.raises(ValueError, match="NaN"):
        conformal_pvalues(torch.tensor([float("nan")]), torch.tensor([True]), torch.tensor([0.1]))
    with pytest.raises(ValueError, match="entries"):
        kept_rate_pvalues(torch.rand(3), torch.tensor([True]), torch.arange(3), torch.tensor([0.5]), 0.1)
    with pytest.raises(ValueError, match="boolean"):
        conformal_pvalues(torch.rand(2), torch.tensor([2, 0]), torch.tensor([0.1]))
