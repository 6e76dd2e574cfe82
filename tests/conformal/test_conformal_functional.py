"""Tests for kglightning.conformal.functional: brute force, scipy and Monte-Carlo coverage/risk checks."""

from __future__ import annotations

import math
import time
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

from kglightning.conformal import (
    binomial_cdf,
    binomial_tail_pvalue,
    bonferroni,
    conformal_quantile,
    fixed_sequence,
    hoeffding_bentkus_pvalue,
    ltt_select,
    prediction_sets,
)
from kglightning.conformal.functional import conformal_min_n, conformal_rank, student_t_sf

ALPHAS = [0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5, 0.7, 0.9]


def brute_quantile(scores: list[float], alpha: float) -> float:
    """Smallest t among the scores with #{s_i <= t} >= ceil((n+1)(1-alpha)); +inf when no score qualifies."""
    n = len(scores)
    k = math.ceil((n + 1) * (1 - Fraction(str(alpha))))  # exact decimal arithmetic
    candidates = [t for t in sorted(set(scores)) if sum(s <= t for s in scores) >= k]
    return candidates[0] if candidates else math.inf


# ---------------------------------------------------------------- quantile and sets


def test_quantile_matches_brute_force_with_ties_and_inf():
    rng = np.random.default_rng(0)
    n_inf = 0
    for _ in range(400):
        n = int(rng.integers(1, 25))
        scores = rng.integers(0, 6, size=n).astype(float).tolist()  # many ties
        alpha = float(rng.choice(ALPHAS))
        expected = brute_quantile(scores, alpha)
        got = conformal_quantile(torch.tensor(scores), alpha).item()
        assert got == expected, (scores, alpha)
        n_inf += math.isinf(expected)
    assert n_inf > 10  # the n-too-small case was exercised


def test_quantile_vectorised_over_rows_and_alphas():
    gen = torch.Generator().manual_seed(1)
    scores = torch.rand(7, 30, generator=gen, dtype=torch.float64)
    alphas = torch.tensor(ALPHAS[:7])
    got = conformal_quantile(scores, alphas)
    want = [brute_quantile(scores[i].tolist(), ALPHAS[i]) for i in range(7)]
    assert got.tolist() == want
    # scalar alpha broadcasts over rows; a 1-D score vector broadcasts over alphas
    assert conformal_quantile(scores, 0.1).tolist() == [brute_quantile(r.tolist(), 0.1) for r in scores]
    assert conformal_quantile(scores[0], alphas).tolist() == [brute_quantile(scores[0].tolist(), a) for a in ALPHAS[:7]]


def test_quantile_n_too_small_is_inf():
    assert conformal_quantile(torch.arange(9.0), 0.05).item() == math.inf  # ceil(10 * 0.95) = 10 > 9
    assert conformal_quantile(torch.arange(19.0), 0.05).item() == 18.0  # ceil(20 * 0.95) = 19
    assert conformal_quantile([3.0], 0.4).item() == math.inf  # ceil(2 * 0.6) = 2 > 1
    assert conformal_quantile([3.0], 0.5).item() == 3.0


def _count_up(alpha: float) -> int:
    """The fewest calibration scores with a finite threshold, counted up from 1 (the old, slow way)."""
    n = 1
    while int(conformal_rank(n, alpha)) > n:
        n += 1
    return n


def test_conformal_min_n_is_the_count_up_in_closed_form():
    gen = np.random.default_rng(0)
    alphas = [*ALPHAS, *np.exp(gen.uniform(math.log(0.004), math.log(0.999), 300)).tolist()]
    alphas += [1 / k for k in range(2, 120)] + [i / 100 for i in range(1, 100)]
    alphas += [np.nextafter(a, d) for a in (0.1, 0.05, 0.2, 1 / 3, 0.01) for d in (0.0, 1.0)]  # at the boundary
    assert [conformal_min_n(a) for a in alphas] == [_count_up(a) for a in alphas]
    # a tiny alpha: at once (counting up took seconds at 1e-5 and never ended at 1e-300), and still the first n
    start = time.perf_counter()
    tiny = {a: conformal_min_n(a) for a in (1e-5, 1e-7, 1e-300, 5e-324)}
    assert time.perf_counter() - start < 1.0
    assert tiny[1e-5] == 99990 and tiny[1e-300] == tiny[5e-324] > 9 * 10**8
    for a, m in tiny.items():
        below = torch.arange(max(1, m - 5000), m, dtype=torch.float64)  # rounding blurs the boundary here
        assert int(conformal_rank(m, a)) <= m and not any(int(conformal_rank(int(k), a)) <= k for k in below[-50:])
        x = (below + 1) * (1.0 - torch.tensor(a, dtype=torch.float64))  # conformal_rank's operations, vectorised
        assert not bool((torch.ceil(x - 1e-9 * x.clamp(min=1.0)) <= below).any())


@pytest.mark.parametrize(
    ("scores", "alpha"),
    [([], 0.1), ([0.1, float("nan")], 0.1), ([0.1], 0.0), ([0.1], 1.0), ([0.1], -0.2), ([0.1], float("nan"))],
)
def test_quantile_rejects_bad_input(scores, alpha):
    with pytest.raises(ValueError):
        conformal_quantile(torch.tensor(scores), alpha)


def test_prediction_sets_inf_gives_full_set_and_shape_checks():
    scores = torch.tensor([[0.1, 0.7], [0.9, 0.2]])
    assert prediction_sets(scores, math.inf).all()
    assert prediction_sets(scores, 0.7).tolist() == [[True, True], [False, True]]  # boundary included
    with pytest.raises(ValueError):
        prediction_sets(scores, torch.tensor([0.1, 0.2]))  # no leading config dim to match
    with pytest.raises(ValueError):
        prediction_sets(torch.tensor([0.1, 0.2]), 0.5)


def test_split_conformal_coverage_on_exchangeable_data():
    """Mean coverage over 2,000 random splits lies in [1 - a, 1 - a + 1/(n+1)] up to Monte-Carlo error."""
    gen = torch.Generator().manual_seed(2)
    trials, n, m, C, alpha = 2000, 200, 20, 10, 0.1
    logits = 2.0 * torch.randn(trials, n + m, C, generator=gen, dtype=torch.float64)
    probs = logits.softmax(-1)
    labels = torch.multinomial(probs.reshape(-1, C), 1, generator=gen).reshape(trials, n + m)
    nonconf = 1.0 - probs  # (trials, n + m, C), lower = more conforming
    true_score = nonconf.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    qhat = conformal_quantile(true_score[:, :n], alpha)  # (trials,)
    sets = prediction_sets(nonconf[:, n:], qhat)  # (trials, m, C)
    covered = sets.gather(-1, labels[:, n:].unsqueeze(-1)).squeeze(-1).double().mean(dim=1)  # per split
    mean, se = covered.mean().item(), covered.std().item() / math.sqrt(trials)
    assert 1 - alpha - 4 * se <= mean <= 1 - alpha + 1 / (n + 1) + 4 * se, (mean, se)
    assert 1 < sets.sum(-1).double().mean().item() < C  # informative sets


# ---------------------------------------------------------------- p-values


@pytest.mark.parametrize("n", [1, 7, 100, 1000])
@pytest.mark.parametrize("p", [0.01, 0.1, 0.37, 0.9])
def test_binomial_cdf_matches_scipy(n, p):
    k = torch.arange(-2, n + 3)
    got = binomial_cdf(k, n, p).numpy()
    want = stats.binom.cdf(k.numpy(), n, p)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-300)


def test_binomial_tail_pvalue_matches_scipy_on_grid():
    gen = torch.Generator().manual_seed(3)
    K, n, alpha = 50, 300, 0.1
    risks = torch.linspace(0.0, 0.3, K, dtype=torch.float64)[:, None]
    losses = (torch.rand(K, n, generator=gen, dtype=torch.float64) < risks).double()
    got = binomial_tail_pvalue(losses, alpha).numpy()
    want = stats.binom.cdf(losses.sum(1).numpy(), n, alpha)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-300)
    assert binomial_tail_pvalue(losses[0].bool(), alpha).shape == ()  # 1-D input, bool losses


def test_binomial_pvalue_rejects_non_binary_and_bad_input():
    with pytest.raises(ValueError, match="binary"):
        binomial_tail_pvalue(torch.full((1, 10), 0.1), 0.1)
    with pytest.raises(ValueError):
        binomial_tail_pvalue(torch.zeros(2, 0), 0.1)
    with pytest.raises(ValueError):
        binomial_tail_pvalue(torch.tensor([[0.0, float("nan")]]), 0.1)
    with pytest.raises(ValueError):
        binomial_tail_pvalue(torch.zeros(1, 5), 1.5)
    with pytest.raises(ValueError):
        hoeffding_bentkus_pvalue(torch.tensor([[0.5, 1.5]]), 0.1)


def _hb_numpy(losses: np.ndarray, alpha: float) -> np.ndarray:
    n = losses.shape[-1]
    r = losses.mean(-1)
    a = np.minimum(r, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        h1 = np.where(a > 0, a * np.log(a / alpha), 0.0) + np.where(a < 1, (1 - a) * np.log((1 - a) / (1 - alpha)), 0.0)
    hoeffding = np.exp(-n * h1)
    bentkus = np.e * stats.binom.cdf(np.ceil(n * r - 1e-12), n, alpha)
    return np.minimum(np.minimum(hoeffding, bentkus), 1.0)


def test_hoeffding_bentkus_matches_numpy_and_is_monotone():
    gen = torch.Generator().manual_seed(4)
    K, n, alpha = 60, 400, 0.15
    scale = torch.linspace(0.0, 0.6, K, dtype=torch.float64)[:, None]
    losses = (torch.rand(K, n, generator=gen, dtype=torch.float64) * scale).round(decimals=3)  # bounded, non-binary
    got = hoeffding_bentkus_pvalue(losses, alpha)
    np.testing.assert_allclose(got.numpy(), _hb_numpy(losses.numpy(), alpha), rtol=1e-9, atol=1e-300)
    assert ((got >= 0) & (got <= 1)).all()
    # monotone in the empirical risk
    order = torch.argsort(losses.mean(1))
    assert (torch.diff(got[order]) >= -1e-15).all()
    assert got[losses.mean(1) >= alpha].eq(1.0).all()


def test_hoeffding_bentkus_dominates_binomial_on_binary_losses():
    gen = torch.Generator().manual_seed(5)
    for n in (10, 100, 1000):
        losses = (torch.rand(40, n, generator=gen) < torch.linspace(0, 0.4, 40)[:, None]).double()
        hb, bt = hoeffding_bentkus_pvalue(losses, 0.2), binomial_tail_pvalue(losses, 0.2)
        assert (hb >= bt * (1 - 1e-12)).all()


# ---------------------------------------------------------------- FWER procedures


def test_bonferroni_hand_made():
    p = torch.tensor([0.0, 0.01, 0.0125, 0.013, 1.0, 0.5, 0.002, 0.2], dtype=torch.float64)
    assert bonferroni(p, 0.1).tolist() == [True, True, True, False, False, False, True, False]  # 0.1 / 8 = 0.0125
    assert bonferroni(torch.stack([p, p.flip(0)]), 0.1).shape == (2, 8)
    with pytest.raises(ValueError):
        bonferroni(p, 0.0)
    with pytest.raises(ValueError):
        bonferroni(torch.tensor([1.2]), 0.1)


def test_fixed_sequence_hand_made():
    p = torch.tensor([0.001, 0.09, 0.11, 0.0, 0.0])
    assert fixed_sequence(p, 0.1).tolist() == [True, True, False, False, False]
    assert fixed_sequence(p, 0.1, order=[4, 3, 0, 2, 1]).tolist() == [True, False, False, True, True]
    assert fixed_sequence(torch.tensor([0.5, 0.0]), 0.1).tolist() == [False, False]  # first fails: nothing valid
    with pytest.raises(ValueError):
        fixed_sequence(p, 0.1, order=[0, 1, 2, 3, 3])


# ---------------------------------------------------------------- LTT


def test_ltt_select_abstain_ties_and_validation():
    cal = torch.zeros(4, 50)
    res = ltt_select(cal, torch.tensor([[3.0, 2.0], [2.0, 2.0], [2.0, 2.0], [5.0, 5.0]]), 0.2, 0.1)
    assert res.index == 1  # tie between 1 and 2 goes to the lowest index
    assert res.mean_set_size.tolist() == [2.5, 2.0, 2.0, 5.0]
    assert ltt_select(torch.ones(4, 50), torch.ones(4), 0.2, 0.1, procedure="bonferroni").index is None
    with pytest.raises(ValueError):
        ltt_select(cal, torch.ones(3), 0.2, 0.1)
    with pytest.raises(ValueError):
        ltt_select(cal, torch.ones(4), 0.2, 0.1, procedure="top_pvalue")


@pytest.mark.parametrize("procedure", ["fixed_sequence", "bonferroni"])
@pytest.mark.parametrize("pvalue", ["binomial", "hoeffding_bentkus"])
def test_ltt_controls_risk_over_repeated_trials(procedure, pvalue):
    """Threshold grid on U(0,1) scores: risk(lam) = 1 - lam, size ~ lam. Violations <= delta + MC error."""
    gen = torch.Generator().manual_seed(6)
    trials, n_cal, n_sel, K, alpha, delta = 300, 300, 100, 40, 0.1, 0.1
    lam = torch.linspace(1.0, 0.7, K, dtype=torch.float64)  # most conservative first
    violations, picks = 0, 0
    for _ in range(trials):
        s_cal = torch.rand(n_cal, generator=gen, dtype=torch.float64)
        s_sel = torch.rand(n_sel, generator=gen, dtype=torch.float64)
        cal_losses = (s_cal[None, :] > lam[:, None]).double()
        sel_sizes = 10 * lam[:, None] + s_sel[None, :]  # bigger threshold -> bigger sets
        res = ltt_select(cal_losses, sel_sizes, alpha, delta, procedure=procedure, pvalue=pvalue)
        if res.index is not None:
            picks += 1
            violations += (1 - lam[res.index]).item() > alpha + 1e-12
    assert picks > 0.9 * trials
    assert violations / trials <= delta + 3 * math.sqrt(delta * (1 - delta) / trials)


def test_vectorised_grid_1000_by_1000():
    gen = torch.Generator().manual_seed(7)
    K, n = 1000, 1000
    risks = torch.linspace(0.0, 0.3, K, dtype=torch.float64)[:, None]
    cal_losses = (torch.rand(K, n, generator=gen, dtype=torch.float64) < risks).double()
    sizes = torch.linspace(10.0, 1.0, K)
    for pvalue in ("binomial", "hoeffding_bentkus"):
        for procedure in ("fixed_sequence", "bonferroni"):
            res = ltt_select(cal_losses, sizes, 0.1, 0.1, procedure=procedure, pvalue=pvalue)
            assert res.index is not None and res.valid[res.index] and res.pvalues.shape == (K,)
    qhat = conformal_quantile(torch.rand(K, n, generator=gen), torch.rand(K, generator=gen) * 0.5 + 0.01)
    assert qhat.shape == (K,) and torch.isfinite(qhat).all()


def test_student_t_sf_matches_scipy():
    for df in (1, 2, 3, 4, 5, 10, 19, 20, 99, 400):
        for t in np.linspace(-6, 6, 49):
            assert student_t_sf(float(t), df) == pytest.approx(stats.t.sf(t, df), abs=1e-12)
    assert student_t_sf(math.inf, 3) == 0.0 and student_t_sf(-math.inf, 3) == 1.0
    with pytest.raises(ValueError, match="df"):
        student_t_sf(1.0, 0)
