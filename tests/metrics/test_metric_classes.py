"""Metric classes: batch-wise updates equal the one-shot functional results."""

import math

import pytest
import torch
from torchmetrics.classification import BinaryCalibrationError

from kglightning.metrics import (
    AUCPR,
    AnswerAccuracy,
    AnswerF1,
    AnswerHit,
    AnswerHits1,
    AnswerPrecision,
    AnswerRecall,
    AverageSetSize,
    BrierScore,
    EmpiricalCoverage,
    ExactMatch,
    ExpectedCalibrationError,
    MaximumCalibrationError,
    RoGAnswerMetrics,
    StrictAnswerF1,
    detection_metrics,
)
from kglightning.metrics.functional import (
    average_set_size,
    brier_score,
    expected_calibration_error,
    maximum_calibration_error,
    rog_answer_metrics,
    set_coverage,
)

PREDS = [["Paris"], "Rome\nLyon\n", ["x"], ["Nice", "Nice", "Oslo"], ["Barack Obama"], [], ["New", "York"]]
GOLDS = [["Paris"], ["Lyon", "Nice"], [], ["Oslo"], ["Obama", "Barack"], ["Bern"], ["New York", "NYC"]]
SINGLE = {
    "acc": AnswerAccuracy,
    "hit": AnswerHit,
    "hit1": AnswerHits1,
    "f1": AnswerF1,
    "precision": AnswerPrecision,
    "recall": AnswerRecall,
    "strict_f1": StrictAnswerF1,
    "em": ExactMatch,
}


def _batches(seq, size):
    return [seq[i : i + size] for i in range(0, len(seq), size)]


@pytest.mark.parametrize("topk", [-1, 1])
def test_answer_metrics_batchwise_equal_functional(topk):
    expected = rog_answer_metrics(PREDS, GOLDS, topk=topk)
    together = RoGAnswerMetrics(topk=topk)
    singles = {k: cls(topk=topk) for k, cls in SINGLE.items()}
    for p, g in zip(_batches(PREDS, 3), _batches(GOLDS, 3)):
        together.update(p, g)
        for m in singles.values():
            m.update(p, g)
    out = together.compute()
    assert set(out) == set(expected)
    for k, v in expected.items():
        assert out[k].item() == pytest.approx(v.item(), abs=1e-12), k
    for k, m in singles.items():
        assert m.compute().item() == pytest.approx(expected[k].item(), abs=1e-12), k
    assert together.skipped.item() == 1 and together.count.item() == 6
    assert singles["f1"].skipped.item() == 1


def test_answer_metric_reset_and_empty():
    m = AnswerF1()
    m.update([["a"]], [["a"]])
    assert m.compute().item() == 1.0
    m.reset()
    m.update([["a"]], [[]])
    with pytest.warns(UserWarning, match="compute"):
        assert math.isnan(AnswerF1().compute().item())
    assert math.isnan(m.compute().item())


@pytest.mark.parametrize("n_bins", [3, 10])
def test_calibration_metrics_batchwise(n_bins):
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(300, generator=g)
    conf[::17] = 1.0
    correct = torch.rand(300, generator=g) < conf
    ece, mce, brier = ExpectedCalibrationError(n_bins), MaximumCalibrationError(n_bins), BrierScore()
    ref = BinaryCalibrationError(n_bins=n_bins)
    for c, y in zip(conf.split(64), correct.split(64)):
        for m in (ece, mce, brier):
            m.update(c, y)
        ref.update(c, y.long())
    assert ece.compute().item() == pytest.approx(expected_calibration_error(conf, correct, n_bins).item(), abs=1e-6)
    assert ece.compute().item() == pytest.approx(ref.compute().item(), abs=1e-6)
    assert mce.compute().item() == pytest.approx(maximum_calibration_error(conf, correct, n_bins).item(), abs=1e-6)
    assert brier.compute().item() == pytest.approx(brier_score(conf, correct).item(), abs=1e-6)
    assert ece.conf_sum.shape == (n_bins + 1,)  # O(bins) state


def test_calibration_metric_arguments():
    with pytest.raises(ValueError):
        ExpectedCalibrationError(n_bins=0)
    with pytest.raises(ValueError):
        ExpectedCalibrationError(norm="l3")
    m = ExpectedCalibrationError(n_bins=2, norm="max")
    m.update([0.25, 0.25, 0.55, 0.75, 0.75], [0, 0, 1, 1, 1])
    assert m.compute().item() == pytest.approx(1 - (0.55 + 0.75 + 0.75) / 3, abs=1e-6)


def test_coverage_metrics_batchwise():
    pred = [{"Paris", "Lyon"}, {"Rome"}, {"Oslo", "Nice", "Bern"}, set(), {"x"}]
    gold = [["Paris", "Nice"], ["Oslo"], ["Oslo", "Nice"], ["Paris"], ["x"]]
    for mode in ("any", "all"):
        m = EmpiricalCoverage(mode=mode)
        m.update(pred[:2], gold[:2])
        m.update(pred[2:], gold[2:])
        assert m.compute().item() == pytest.approx(set_coverage(pred, gold, mode).item())
    s = AverageSetSize()
    s.update(pred[:3])
    s.update(pred[3:])
    assert s.compute().item() == pytest.approx(average_set_size(pred).item())
    with pytest.raises(ValueError):
        EmpiricalCoverage(mode="most")


def test_classification_wrappers():
    preds, target = torch.tensor([0.9, 0.8, 0.3, 0.1]), torch.tensor([1, 0, 1, 0])
    m = AUCPR()
    m.update(preds[:2], target[:2])
    m.update(preds[2:], target[2:])
    assert m.compute().item() == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)
    out = detection_metrics(prefix="val/")(preds, target)
    assert set(out) == {f"val/{k}" for k in ("f1", "precision", "recall", "acc", "auroc", "auc_pr")}
    assert out["val/auroc"].item() == pytest.approx(0.75)
