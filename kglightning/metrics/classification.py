"""Threshold-free and thresholded binary classification metrics (KG-Guard's hallucination detector).

These come from torchmetrics; this module names them the way the papers do and bundles KG-Guard's set (F1,
precision, recall, accuracy, AUROC, AUC-PR). The thresholded ones flag a node when its score is ``>= threshold``,
the rule the detector tunes its threshold for and predicts with (torchmetrics' own rule is ``>``). AUC-PR is torchmetrics' average precision (the step-wise area
under the precision-recall curve, as ``sklearn.metrics.average_precision_score``), not a trapezoidal area.
"""

from __future__ import annotations

from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    BinaryAccuracy,
    BinaryAUROC,
    BinaryAveragePrecision,
    BinaryF1Score,
    BinaryPrecision,
    BinaryRecall,
)
from torchmetrics.functional.classification import (
    binary_accuracy,
    binary_auroc,
    binary_average_precision,
    binary_f1_score,
    binary_precision,
    binary_recall,
)

auc_pr = binary_average_precision
"""Functional AUC-PR: torchmetrics' ``binary_average_precision`` (``preds`` are scores, ``target`` 0/1)."""


class AUCPR(BinaryAveragePrecision):
    """Area under the precision-recall curve (average precision) of a binary detector.

    Same as torchmetrics' ``BinaryAveragePrecision``; ``thresholds=None`` (the default) is exact.

    Example:
        >>> import torch
        >>> m = AUCPR()
        >>> m.update(torch.tensor([0.9, 0.8, 0.3, 0.1]), torch.tensor([1, 0, 1, 0]))
        >>> round(m.compute().item(), 4)
        0.8333
    """


class _FlagsAtThreshold:
    """A torchmetrics binary metric whose node is flagged when its score is ``>= threshold``.

    torchmetrics flags ``score > threshold``; the detector tunes its threshold for ``>=`` (a tuned threshold is one
    of the validation scores, :func:`~kglightning.modules.detector.best_f1_threshold`) and flags with ``>=``, so the
    scores become 0/1 flags here, which torchmetrics then counts as they are. One rule everywhere.
    """

    threshold: float

    def update(self, preds: Tensor, target: Tensor) -> None:
        super().update((preds >= self.threshold).int(), target)  # type: ignore[misc]


class F1AtThreshold(_FlagsAtThreshold, BinaryF1Score):
    """Binary F1 of the nodes flagged at ``score >= threshold``."""


class PrecisionAtThreshold(_FlagsAtThreshold, BinaryPrecision):
    """Binary precision of the nodes flagged at ``score >= threshold``."""


class RecallAtThreshold(_FlagsAtThreshold, BinaryRecall):
    """Binary recall of the nodes flagged at ``score >= threshold``."""


class AccuracyAtThreshold(_FlagsAtThreshold, BinaryAccuracy):
    """Binary accuracy of the nodes flagged at ``score >= threshold``."""


def detection_metrics(threshold: float = 0.5, prefix: str | None = None) -> MetricCollection:
    """KG-Guard's detector metrics as one ``MetricCollection``: f1, precision, recall, acc, auroc, auc_pr.

    Args:
        threshold: a node is flagged when its score is ``>= threshold`` (for F1, precision, recall and accuracy).
        prefix: optional key prefix, e.g. ``"val/"``.

    Example:
        >>> import torch
        >>> m = detection_metrics(threshold=0.8)
        >>> m.update(torch.tensor([0.9, 0.8, 0.3, 0.1]), torch.tensor([1, 0, 1, 0]))
        >>> {k: round(v.item(), 4) for k, v in m.compute().items()}
        {'acc': 0.5, 'auc_pr': 0.8333, 'auroc': 0.75, 'f1': 0.5, 'precision': 0.5, 'recall': 0.5}

    The node scored exactly 0.8 is flagged (torchmetrics' ``>`` would leave it: precision 1.0, F1 0.667).
    """
    return MetricCollection(
        {
            "f1": F1AtThreshold(threshold=threshold),
            "precision": PrecisionAtThreshold(threshold=threshold),
            "recall": RecallAtThreshold(threshold=threshold),
            "acc": AccuracyAtThreshold(threshold=threshold),
            "auroc": BinaryAUROC(),
            "auc_pr": BinaryAveragePrecision(),
        },
        prefix=prefix,
    )


def detection_scores(probs: Tensor, target: Tensor, threshold: float | Tensor = 0.5) -> dict[str, Tensor]:
    """The values of :func:`detection_metrics` computed at once, on the device of ``probs`` (no Metric states).

    For scores that are already gathered (e.g. a validation epoch's), where building Metric objects would put their
    states on the default device.

    Args:
        probs: ``(N,)`` scores in ``[0, 1]``.
        target: ``(N,)`` 0/1 labels.
        threshold: a node is flagged when its score is ``>= threshold``; a ``(N,)`` tensor gives each node its own
            (e.g. one threshold per population of answers).

    Example:
        >>> import torch
        >>> scores = detection_scores(torch.tensor([0.9, 0.8, 0.3, 0.1]), torch.tensor([1, 0, 1, 0]), 0.8)
        >>> {k: round(v.item(), 4) for k, v in scores.items()}
        {'f1': 0.5, 'precision': 0.5, 'recall': 0.5, 'acc': 0.5, 'auroc': 0.75, 'auc_pr': 0.8333}
    """
    target = target.long()
    flags = (probs >= threshold).int()  # the detector's rule (torchmetrics' own is ``>``)
    return {
        "f1": binary_f1_score(flags, target),
        "precision": binary_precision(flags, target),
        "recall": binary_recall(flags, target),
        "acc": binary_accuracy(flags, target),
        "auroc": binary_auroc(probs, target),
        "auc_pr": binary_average_precision(probs, target),
    }


def set_threshold(metrics: MetricCollection, threshold: float) -> MetricCollection:
    """Set the decision threshold of every thresholded metric of ``metrics`` in place (states stay where they are).

    Example:
        >>> m = set_threshold(detection_metrics(), 0.8)
        >>> m["f1"].threshold, m["acc"].threshold
        (0.8, 0.8)
    """
    for metric in metrics.values():
        if hasattr(metric, "threshold"):
            metric.threshold = float(threshold)
    return metrics


__all__ = [
    "AUCPR",
    "AccuracyAtThreshold",
    "F1AtThreshold",
    "PrecisionAtThreshold",
    "RecallAtThreshold",
    "BinaryAUROC",
    "BinaryAveragePrecision",
    "auc_pr",
    "binary_auroc",
    "binary_average_precision",
    "detection_metrics",
    "detection_scores",
    "set_threshold",
]
