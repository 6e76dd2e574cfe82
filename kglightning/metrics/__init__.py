"""torchmetrics Metric classes for trustworthy KGQA; the math lives in :mod:`kglightning.metrics.functional`.

* answers (:mod:`.qa`): RoG-compatible accuracy, Hit, Hits@1, F1, precision, recall; strict set F1 and EM;
* calibration (:mod:`.calibration`): ECE, MCE, Brier score, with O(bins) DDP-safe states;
* prediction sets (:mod:`.coverage`): empirical coverage and average set size;
* detection (:mod:`.classification`): AUROC and AUC-PR from torchmetrics, and KG-Guard's metric collection;
* :func:`~.plots.plot_reliability_diagram` for a headless reliability diagram PNG.
"""

from typing import TYPE_CHECKING

from kglightning.lazy import lazy_exports

if TYPE_CHECKING:  # the exports, imported on first use (kglightning.lazy)
    from kglightning.metrics.calibration import BrierScore, ExpectedCalibrationError, MaximumCalibrationError
    from kglightning.metrics.classification import AUCPR, BinaryAUROC, BinaryAveragePrecision, detection_metrics
    from kglightning.metrics.coverage import AverageSetSize, EmpiricalCoverage
    from kglightning.metrics.plots import plot_reliability_diagram
    from kglightning.metrics.qa import (
        AnswerAccuracy,
        AnswerF1,
        AnswerHit,
        AnswerHits1,
        AnswerPrecision,
        AnswerRecall,
        ExactMatch,
        RoGAnswerMetrics,
        StrictAnswerF1,
    )

__getattr__, __dir__ = lazy_exports(__name__, __file__)

__all__ = [
    "AUCPR",
    "AnswerAccuracy",
    "AnswerF1",
    "AnswerHit",
    "AnswerHits1",
    "AnswerPrecision",
    "AnswerRecall",
    "AverageSetSize",
    "BinaryAUROC",
    "BinaryAveragePrecision",
    "BrierScore",
    "EmpiricalCoverage",
    "ExactMatch",
    "ExpectedCalibrationError",
    "MaximumCalibrationError",
    "RoGAnswerMetrics",
    "StrictAnswerF1",
    "detection_metrics",
    "plot_reliability_diagram",
]
