"""The detector's decision rule: exact threshold searches, one threshold per population, ties to the fewest flags."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torchmetrics.functional.classification import binary_average_precision

from kglightning.metrics.classification import detection_scores
from kglightning.modules.detector_thresholds import (
    EDGE,
    Decision,
    best_ap_offset,
    best_f1_threshold,
    best_joint_thresholds,
    platt,
    shifted_probs,
    tune_decision,
)


def _f1(probs: torch.Tensor, target: torch.Tensor, threshold) -> float:
    return float(detection_scores(probs, target, threshold)["f1"])


def _saturating(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 probabilities of which many are exactly 1.0 or within EDGE of it, as large logits give."""
    target = torch.randint(0, 2, (n,), generator=gen)
    logits = torch.randn(n, generator=gen) * 12 + 6 * target
    return torch.sigmoid(logits.float()), target


def test_best_f1_threshold_hand_computed():
    probs, target = torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1])
    thr, f1 = best_f1_threshold(probs, target)
    # p >= 0.35 -> preds [0,1,1,1]: P=2/3, R=1, F1=0.8; p >= 0.8 -> P=1, R=0.5, F1=2/3
    assert thr == pytest.approx(0.35) and f1 == pytest.approx(0.8)


def test_ties_keep_the_fewest_flags():
    # flagging 0.9 alone (TP 1) and flagging all four (TP 2, FP 2) both give F1 2/3: the rule flags one answer
    probs, target = torch.tensor([0.9, 0.7, 0.6, 0.5]), torch.tensor([1, 0, 0, 1])
    thr, f1 = best_f1_threshold(probs, target)
    assert thr == pytest.approx(0.9) and f1 == pytest.approx(2 / 3)
    # the same in the joint search, across populations: the fewest flags in all
    tg, tu, f1 = best_joint_thresholds(probs, target, torch.tensor([0.8, 0.2]), torch.tensor([0, 0]))
    assert (probs >= tg).sum() == 1 and tu > 0.8 and f1 == pytest.approx(2 / 3)
    d = tune_decision(torch.logit(probs), target, torch.zeros(0), torch.zeros(0), "grounded", Decision(0.5, 0.5, 0.0))
    assert d.threshold == pytest.approx(0.9)


def test_the_f1_found_is_the_f1_the_stored_threshold_gives_even_when_scores_saturate():
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        probs, target = _saturating(gen, 12)
        thr, f1 = best_f1_threshold(probs, target)
        stored = float(torch.tensor(thr, dtype=torch.float32))  # the float32 buffer keeps it exactly
        assert stored == thr and EDGE - 1e-9 <= thr <= 1 - EDGE + 1e-9
        assert f1 == pytest.approx(_f1(probs, target, thr), abs=1e-6)
        # and no threshold in [EDGE, 1 - EDGE] does better
        grid = torch.cat([probs.clamp(EDGE, 1 - EDGE), torch.linspace(EDGE, 1 - EDGE, 101)])
        assert f1 >= max(_f1(probs, target, float(t)) for t in grid) - 1e-6


def test_a_saturated_cut_is_applied_as_tuned():
    """The old search found F1 0.8 at the cut 1.0, then clamped it to 1 - 1e-4, which also flagged the four faithful
    answers just below 1.0: F1 0.44 applied. Tuned and applied F1 are now the same number."""
    logits = torch.tensor([20.0, 20.0, 16.0, 16.0, 16.0, 16.0, 0.4])  # float32's sigmoid: 1.0, 1.0, 1 - 2**-23, ...
    target = torch.tensor([1, 1, 0, 0, 0, 0, 1])
    probs = torch.sigmoid(logits)
    assert probs[:2].tolist() == [1.0, 1.0] and float(probs[2]) == 1 - 2**-23
    d = tune_decision(logits, target, torch.zeros(0), torch.zeros(0), "grounded", Decision(0.5, 0.5, 0.0))
    assert _f1(probs, target, d.threshold) == pytest.approx(best_f1_threshold(probs, target)[1]) == pytest.approx(0.8)


def test_joint_thresholds_are_the_best_pair_by_brute_force():
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        probs, target = _saturating(gen, 9)
        loose, loose_target = _saturating(gen, 7)
        tg, tu, f1 = best_joint_thresholds(probs, target, loose, loose_target)
        both, y = torch.cat([probs, loose]), torch.cat([target, loose_target])

        def at(a: float, b: float, probs=probs, loose=loose, both=both, y=y) -> float:
            return _f1(both, y, torch.cat([torch.full_like(probs, a), torch.full_like(loose, b)]))

        assert f1 == pytest.approx(at(tg, tu), abs=1e-6)
        cuts_g = [*probs.clamp(EDGE, 1 - EDGE).tolist(), 1 - EDGE]
        cuts_u = [*loose.clamp(EDGE, 1 - EDGE).tolist(), 1 - EDGE]
        assert f1 >= max(at(a, b) for a, b in itertools.product(cuts_g, cuts_u)) - 1e-6
        # at least as good over every answer as the grounded-best threshold with the best ungrounded one after it
        d = tune_decision(torch.logit(probs.double()).float(), target, torch.logit(loose.double()).float(),
                          loose_target, "grounded", Decision(0.5, 0.5, 0.0), tune_offset=False)  # fmt: skip
        assert f1 >= at(d.threshold, d.ungrounded_threshold) - 1e-6


def test_a_validation_split_without_grounded_answers_still_tunes_the_ungrounded_threshold():
    loose, loose_target = torch.tensor([2.0, 1.0, -1.0, -3.0]), torch.tensor([1, 1, 0, 0])
    for mode in ("grounded", "all"):
        d = tune_decision(torch.zeros(0), torch.zeros(0, dtype=torch.long), loose, loose_target, mode,
                          Decision(0.42, 0.5, 0.0))  # fmt: skip
        assert d.threshold == pytest.approx(0.42)  # kept: nothing to tune it on
        flags = shifted_probs(loose, d.offset) >= d.ungrounded_threshold
        assert flags.tolist() == [True, True, False, False]
    # and no grounded answer gives no reason to move the offset
    assert best_ap_offset(torch.zeros(0), torch.zeros(0), loose, loose_target) == 0.0


def test_untuned_quantities_keep_their_values():
    probs, target = torch.tensor([2.2, -1.4]), torch.tensor([1, 0])
    loose, loose_target = torch.tensor([1.0, -1.0]), torch.tensor([1, 0])
    d = tune_decision(probs, target, loose, loose_target, "all", Decision(0.3, 0.6, 1.5), tune_threshold=False)
    assert (d.threshold, d.ungrounded_threshold) == (0.3, 0.6) and d.offset != 1.5
    d = tune_decision(probs, target, loose, loose_target, "all", Decision(0.3, 0.6, 1.5), tune_offset=False)
    assert d.offset == 1.5


def test_calibrated_mode_flags_where_each_population_s_platt_probability_reaches_half_the_best_f1():
    gen = torch.Generator().manual_seed(0)
    y = (torch.rand(600, generator=gen) < 0.3).long()
    logits = 4.0 * (2.0 * y - 1.0) + torch.randn(600, generator=gen) * 4.0  # over-confident: Platt shrinks them
    loose_y = (torch.rand(300, generator=gen) < 0.8).long()
    loose = (2.0 * loose_y - 1.0) + torch.randn(300, generator=gen) - 3.0  # on another scale, too low
    d = tune_decision(logits, y, loose, loose_y, "calibrated", Decision(0.5, 0.5, 0.0))
    (ag, bg), (au, bu) = platt(logits, y), platt(loose, loose_y)
    assert 0 < ag < 1
    pg, pu = torch.sigmoid(ag * logits.double() + bg), torch.sigmoid(au * loose.double() + bu)
    # calibrated: each population's probabilities average to its rate of hallucinations
    assert abs(float(pg.mean()) - float(y.float().mean())) < 0.01
    assert abs(float(pu.mean()) - float(loose_y.float().mean())) < 0.01
    t = best_f1_threshold(torch.cat([pg, pu]).float(), torch.cat([y, loose_y]))[1] / 2
    # each population's threshold on the reported probabilities flags what its calibrated probability >= t flags
    away = lambda p: (p - t).abs() > 1e-4  # noqa: E731
    flags_g, flags_u = torch.sigmoid(logits) >= d.threshold, shifted_probs(loose, d.offset) >= d.ungrounded_threshold
    assert torch.equal(flags_g[away(pg)], (pg >= t)[away(pg)]) and torch.equal(flags_u[away(pu)], (pu >= t)[away(pu)])
    # a one-class population keeps a finite threshold (its Platt fit is shrunk towards the identity)
    one = tune_decision(logits, y, loose, torch.ones_like(loose_y), "calibrated", Decision(0.5, 0.5, 0.0))
    assert math.isfinite(one.ungrounded_threshold) and EDGE - 1e-9 <= one.ungrounded_threshold <= 1 - EDGE + 1e-9


def test_thresholds_reach_logits_up_to_float32_saturation():
    """Found by a review: a window of [1e-4, 1 - 1e-4] could not separate logits 12 and 10 (both above 9.2)."""
    logits, target = torch.tensor([12.0, 12.0, 10.0, 10.0, 10.0, 10.0]), torch.tensor([1, 1, 0, 0, 0, 0])
    thr, f1 = best_f1_threshold(torch.sigmoid(logits), target)
    assert f1 == 1.0 and _f1(torch.sigmoid(logits), target, thr) == pytest.approx(1.0)


def test_the_ap_offset_is_chosen_on_the_probabilities_the_forward_pass_gives():
    """Found by a review: chosen on float64 logits, the offset could saturate the float32 probabilities it is
    applied to, flattening the ungrounded answers' ranking."""
    gen = torch.Generator().manual_seed(0)
    y = (torch.rand(200, generator=gen) < 0.3).long()
    probs = torch.sigmoid((4.0 * (2.0 * y - 1.0) + torch.randn(200, generator=gen) * 6.0).float())
    loose_y = (torch.rand(40, generator=gen) < 0.8).long()
    loose = (8.0 * (2.0 * loose_y - 1.0) + torch.randn(40, generator=gen) * 4.0).float()
    off = best_ap_offset(probs, y, loose, loose_y)

    def ap_at(o: float) -> float:
        return float(binary_average_precision(torch.cat([probs, shifted_probs(loose, o)]), torch.cat([y, loose_y])))

    assert ap_at(off) >= max(ap_at(float(o)) for o in torch.linspace(-12, 12, 241)) - 1e-9


def test_fixed_thresholds_get_the_offset_that_fits_the_ungrounded_answers_to_them():
    """Found by a review: with tune_threshold=False the AP offset was applied to the fixed threshold, which could
    flag none of a perfectly ranked set."""
    loose, loose_y = torch.tensor([4.0, 3.0, -2.0, -3.0]), torch.tensor([1, 1, 0, 0])
    d = tune_decision(torch.zeros(0), torch.zeros(0, dtype=torch.long), loose, loose_y, "grounded",
                      Decision(0.5, 0.5, 0.0), tune_threshold=False)  # fmt: skip
    assert (shifted_probs(loose, d.offset) >= 0.5).tolist() == [True, True, False, False]


def test_calibrated_mode_without_a_hallucinated_answer_keeps_the_fewest_flags():
    logits, loose = torch.tensor([1.0, -1.0]), torch.tensor([0.5, -0.5])
    zeros = torch.zeros(2, dtype=torch.long)
    d = tune_decision(logits, zeros, loose, zeros, "calibrated", Decision(0.5, 0.5, 0.0))
    assert not (torch.sigmoid(logits) >= d.threshold).any()
    assert not (shifted_probs(loose, d.offset) >= d.ungrounded_threshold).any()


def test_calibrated_mode_with_a_backwards_population_keeps_the_rule_monotone():
    """Found by a review: a negative Platt slope made 'calibrated >= t' a lower tail, which p >= thr cannot express,
    and the clamp flagged none of the answers the rule meant."""
    gen = torch.Generator().manual_seed(1)
    y = (torch.rand(300, generator=gen) < 0.5).long()
    logits = 2.0 * (2.0 * y - 1.0) + torch.randn(300, generator=gen)
    loose_y = (torch.rand(200, generator=gen) < 0.7).long()
    loose = -2.0 * (2.0 * loose_y - 1.0) + torch.randn(200, generator=gen)  # ranked backwards
    a, _ = platt(loose, loose_y)
    assert 0 < a < 0.05  # a slope near 0, never below
    d = tune_decision(logits, y, loose, loose_y, "calibrated", Decision(0.5, 0.5, 0.0))
    (ag, bg), (au, bu) = platt(logits, y), (a, platt(loose, loose_y)[1])
    pg, pu = torch.sigmoid(ag * logits.double() + bg), torch.sigmoid(au * loose.double() + bu)
    t = best_f1_threshold(torch.cat([pg, pu]).float(), torch.cat([y, loose_y]))[1] / 2
    assert torch.equal(shifted_probs(loose, d.offset) >= d.ungrounded_threshold, pu >= t)
    assert torch.equal(torch.sigmoid(logits) >= d.threshold, pg >= t)


def test_calibrated_cuts_past_float32_saturation_flag_the_nearest_achievable_set():
    """Found by a review: a cut past logit 16.6 was clamped, so the stored threshold flagged answers the rule did
    not mean to flag (24 of 75 there)."""
    gen = torch.Generator().manual_seed(2)
    y = (torch.rand(400, generator=gen) < 0.3).long()
    logits = 20.0 + 3.0 * (2.0 * y - 1.0) + torch.randn(400, generator=gen) * 2.0  # many saturate at 1.0
    d = tune_decision(logits, y, torch.zeros(0), torch.zeros(0, dtype=torch.long), "calibrated",
                      Decision(0.5, 0.5, 0.0))  # fmt: skip
    a, b = platt(logits, y)
    p = torch.sigmoid(a * logits.double() + b)
    t = best_f1_threshold(p.float(), y)[1] / 2
    wanted, got = p >= t, torch.sigmoid(logits) >= d.threshold
    probs = torch.sigmoid(logits)
    best = min(int(((probs >= c) != wanted).sum()) for c in [*probs.unique().tolist(), 1 - EDGE])
    assert int((got != wanted).sum()) == best  # as near the rule as a float32 threshold on p can get
