"""ECE, MCE, Brier and reliability bins against hand-computed values and torchmetrics."""

import math

import pytest
import torch
from torchmetrics.functional.classification import binary_calibration_error

from kglightning.metrics.functional.calibration import (
    brier_score,
    calibration_bin_sums,
    calibration_error_from_bin_sums,
    expected_calibration_error,
    maximum_calibration_error,
    reliability_bins,
)

CONF = [0.25, 0.25, 0.55, 0.75, 0.75]
CORRECT = [False, False, True, True, True]


def test_hand_values_two_bins():
    # bin [0, .5): conf .25 .25, acc 0 -> gap .25, weight 2/5; bin [.5, 1): mean conf .6833, acc 1 -> gap .3167, 3/5
    gap1 = 1 - (0.55 + 0.75 + 0.75) / 3
    assert expected_calibration_error(CONF, CORRECT, n_bins=2).item() == pytest.approx(0.25 * 2 / 5 + gap1 * 3 / 5)
    assert maximum_calibration_error(CONF, CORRECT, n_bins=2).item() == pytest.approx(gap1, abs=1e-6)
    assert brier_score([1.0, 0.5, 0.0], [True, False, False]).item() == pytest.approx(0.25 / 3)


def test_confidence_one_has_its_own_bin_as_in_torchmetrics():
    # torchmetrics bins are [k/n, (k+1)/n); conf == 1.0 lands in an extra bin of its own
    conf, correct = [0.9, 1.0], [True, False]
    ece = expected_calibration_error(conf, correct, n_bins=2).item()
    assert ece == pytest.approx(0.5 * 0.1 + 0.5 * 1.0)  # not 0.45, which folding 1.0 into [.5, 1] would give
    assert ece == pytest.approx(binary_calibration_error(torch.tensor(conf), torch.tensor([1, 0]), n_bins=2).item())
    s, c, n = calibration_bin_sums(conf, correct, n_bins=2)
    assert n.tolist() == [0.0, 1.0, 1.0]


@pytest.mark.parametrize("n_bins", [1, 2, 10, 15])
@pytest.mark.parametrize("norm", ["l1", "max", "l2"])
def test_bin_sums_equal_torchmetrics(n_bins, norm):
    g = torch.Generator().manual_seed(n_bins)
    conf = torch.rand(500, generator=g)
    conf[:20] = 1.0
    conf[20:30] = 0.0
    conf[30:40] = 0.5
    correct = torch.rand(500, generator=g) < conf
    ours = calibration_error_from_bin_sums(*calibration_bin_sums(conf, correct, n_bins), norm=norm)
    ref = binary_calibration_error(conf, correct.long(), n_bins=n_bins, norm=norm)
    assert ours.item() == pytest.approx(ref.item(), abs=1e-6)
    assert expected_calibration_error(conf, correct, n_bins, norm).item() == pytest.approx(ref.item(), abs=1e-6)


def test_reliability_bins_are_the_ece_bins_with_one_apart():
    c, a, n = reliability_bins([0.1, 0.2, 0.9, 1.0, 0.6], [0, 1, 1, 1, 0], n_bins=2)
    assert n.tolist() == [2.0, 2.0, 1.0]  # [0, .5), [.5, 1), exactly 1.0
    assert c.tolist() == pytest.approx([0.15, 0.75, 1.0])
    assert a.tolist() == pytest.approx([0.5, 0.5, 1.0])
    c, a, n = reliability_bins([0.05], [1], n_bins=4)
    assert n.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0] and a.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    # the diagram's bins give the ECE
    conf, correct = [0.1, 0.2, 0.9, 1.0, 0.6], [0, 1, 1, 1, 0]
    c, a, n = reliability_bins(conf, correct, n_bins=2)
    gaps = (a - c).abs() * n / n.sum()
    assert float(gaps.sum()) == pytest.approx(float(expected_calibration_error(conf, correct, n_bins=2)), abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_confidence_lands_in_the_same_bin_in_either_dtype(dtype):
    conf = torch.tensor([0.7, 0.9, 0.3, 0.1], dtype=dtype)
    correct = torch.tensor([True, False, True, False])
    _, _, n = calibration_bin_sums(conf, correct, n_bins=10)
    assert n.nonzero().flatten().tolist() == [1, 3, 7, 9]  # 0.7 in [.7, .8), 0.9 in [.9, 1), as the decimals say
    # bins [.1,.2) .1 wrong; [.3,.4) .3 right; [.7,.8) .7 right; [.9,1) .9 wrong: ECE = (.1 + .7 + .3 + .9) / 4
    assert float(expected_calibration_error(conf, correct, n_bins=10)) == pytest.approx(0.5, abs=1e-6)
    # just below 1 is not "exactly 1.0", even where float32 rounds it up
    _, _, n = calibration_bin_sums(torch.tensor([1 - 1e-9, 1.0], dtype=torch.float64), [True, True], n_bins=10)
    assert n.tolist()[-2:] == [1.0, 1.0]


def test_validation_and_empty():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        expected_calibration_error([1.5], [True])
    with pytest.raises(ValueError, match="values"):
        brier_score([0.5, 0.5], [True])
    with pytest.raises(ValueError, match="boolean"):
        brier_score([0.5], [2])
    assert math.isnan(expected_calibration_error([], []).item())
    assert math.isnan(brier_score([], []).item())
    empty = calibration_bin_sums([], [], 3)
    assert math.isnan(calibration_error_from_bin_sums(*empty).item())
    with pytest.raises(ValueError, match="norm"):
        calibration_error_from_bin_sums(*calibration_bin_sums([0.5], [1], 3), norm="l3")
