"""Threshold-free and thresholded binary classification metrics (KG-Guard's hallucination detector).

These come from torchmetrics as they are; this module only names them the way the papers do and bundles KG-Guard's
set (F1, precision, recall, accuracy, AUROC, AUC-PR). AUC-PR is torchmetrics' average precision (the step-wise area
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


def detection_metrics(threshold: float = 0.5, prefix: str | None = None) -> MetricCollection:
    """KG-Guard's detector metrics as one ``MetricCollection``: f1, precision, recall, acc, auroc, auc_pr.

    Args:
        threshold: score above which a node is flagged (for F1, precision, recall and accuracy).
        prefix: optional key prefix, e.g. ``"val/"``.

    Example:
        >>> import torch
        >>> m = detection_metrics()
        >>> m.update(torch.tensor([0.9, 0.8, 0.3, 0.1]), torch.tensor([1, 0, 1, 0]))
        >>> {k: round(v.item(), 4) for k, v in m.compute().items()}
        {'acc': 0.5, 'auc_pr': 0.8333, 'auroc': 0.75, 'f1': 0.5, 'precision': 0.5, 'recall': 0.5}
    """
    return MetricCollection(
        {
            "f1": BinaryF1Score(threshold=threshold),
            "precision": BinaryPrecision(threshold=threshold),
            "recall": BinaryRecall(threshold=threshold),
            "acc": BinaryAccuracy(threshold=threshold),
            "auroc": BinaryAUROC(),
            "auc_pr": BinaryAveragePrecision(),
        },
        prefix=prefix,
    )


def detection_scores(probs: Tensor, target: Tensor, threshold: float = 0.5) -> dict[str, Tensor]:
    """The values of :func:`detection_metrics` computed at once, on the device of ``probs`` (no Metric states).

    For scores that are already gathered (e.g. a validation epoch's), where building Metric objects would put their
    states on the default device.

    Args:
        probs: ``(N,)`` scores in ``[0, 1]``.
        target: ``(N,)`` 0/1 labels.
        threshold: score above which a node is flagged.

    Example:
        >>> import torch
        >>> scores = detection_scores(torch.tensor([0.9, 0.8, 0.3, 0.1]), torch.tensor([1, 0, 1, 0]))
        >>> {k: round(v.item(), 4) for k, v in scores.items()}
        {'f1': 0.5, 'precision': 0.5, 'recall': 0.5, 'acc': 0.5, 'auroc': 0.75, 'auc_pr': 0.8333}
    """
    target = target.long()
    return {
        "f1": binary_f1_score(probs, target, threshold=threshold),
        "precision": binary_precision(probs, target, threshold=threshold),
        "recall": binary_recall(probs, target, threshold=threshold),
        "acc": binary_accuracy(probs, target, threshold=threshold),
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
    "BinaryAUROC",
    "BinaryAveragePrecision",
    "auc_pr",
    "binary_auroc",
    "binary_average_precision",
    "detection_metrics",
    "detection_scores",
    "set_threshold",
]
