"""Threshold-free and thresholded binary classification metrics (KG-Guard's hallucination detector).

These come from torchmetrics as they are; this module only names them the way the papers do and bundles KG-Guard's
set (F1, precision, recall, accuracy, AUROC, AUC-PR). AUC-PR is torchmetrics' average precision (the step-wise area
under the precision-recall curve, as ``sklearn.metrics.average_precision_score``), not a trapezoidal area.
"""

from __future__ import annotations

from torchmetrics import MetricCollection
from torchmetrics.classification import (
    BinaryAccuracy,
    BinaryAUROC,
    BinaryAveragePrecision,
    BinaryF1Score,
    BinaryPrecision,
    BinaryRecall,
)
from torchmetrics.functional.classification import binary_auroc, binary_average_precision

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


__all__ = [
    "AUCPR",
    "BinaryAUROC",
    "BinaryAveragePrecision",
    "auc_pr",
    "binary_auroc",
    "binary_average_precision",
    "detection_metrics",
]
