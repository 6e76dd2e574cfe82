"""Scoring a whole predictions file: RoG's per-question answer scores averaged, strict scores, and the
(confidence, correct) pairs behind ECE/MCE/Brier.

The rows are any objects with ``prediction`` (a list, or a newline-joined string), ``ground_truth`` (a list),
``confidence`` (``None``, a list aligned with the prediction, or a dict answer → confidence) and ``line`` (for error
messages), such as :class:`~kglightning.data.predictions.PredictionLine`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from kglightning.metrics.functional.calibration import (
    brier_score,
    expected_calibration_error,
    maximum_calibration_error,
)
from kglightning.metrics.functional.qa import ALL_KEYS, answer_correctness, answer_scores, prepare_prediction

#: the per-question scores written to ``detailed_eval_result.jsonl``
DETAILED_KEYS = ("acc", "hit", "hit1", "f1", "precision", "recall", "strict_f1", "em")


class AnswerError(ValueError):
    """A row that cannot be scored (e.g. a predicted answer without a confidence).

    Args:
        message: what is wrong.
        line: the row's line in its file, if known.
        field: the offending field.
    """

    def __init__(self, message: str, line: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.reason, self.line, self.field = message, line, field


def confidence_pairs(row: Any, scored: Sequence[str]) -> tuple[list[float], list[bool]]:
    """Per scored proposed answer (empty ones skipped): its confidence and whether it RoG-matches a gold.

    A list ``confidence`` aligned with a list prediction gives each distinct answer the confidence of its first
    occurrence (RoG de-duplicates list predictions); with a string prediction it aligns with the lines.

    Example:
        >>> from types import SimpleNamespace
        >>> row = SimpleNamespace(prediction=["Paris", "Lyon", "Paris"], confidence=[0.9, 0.4, 0.1],
        ...                       ground_truth=["Paris"], line=1)
        >>> confidence_pairs(row, ["Paris", "Lyon"])
        ([0.9, 0.4], [True, False])
    """
    if row.confidence is None:
        return [], []
    if isinstance(row.confidence, list) and isinstance(row.prediction, str):
        items = [(p, c) for p, c in zip(row.prediction.split("\n"), row.confidence) if p.strip()]
    else:
        if isinstance(row.confidence, dict):
            table = row.confidence
        else:
            table = {}
            for p, c in zip(row.prediction, row.confidence):
                table.setdefault(p, c)
        items = []
        for p in scored:
            if not p.strip():
                continue
            if p not in table:
                raise AnswerError(f"no confidence for predicted answer {p!r}", line=row.line, field="confidence")
            items.append((p, table[p]))
    correct = answer_correctness([p for p, _ in items], row.ground_truth)
    return [float(c) for _, c in items], correct


def calibration_pairs(rows: Iterable[Any], topk: int = -1) -> tuple[list[float], list[bool]]:
    """Every scored answer's (confidence, correct) pair over the rows with a non-empty ground truth: the pairs
    behind ECE/MCE/Brier and the reliability diagram of :func:`score_predictions`."""
    conf_all: list[float] = []
    correct_all: list[bool] = []
    for row in rows:
        if not row.ground_truth:
            continue
        c, ok = confidence_pairs(row, prepare_prediction(row.prediction, topk))
        conf_all += c
        correct_all += ok
    return conf_all, correct_all


def score_predictions(
    rows: Sequence[Any], topk: int = -1, n_bins: int = 10
) -> tuple[dict[str, float], list[dict[str, Any]], tuple[list[float], list[bool]]]:
    """Scores of a predictions file, computed exactly as RoG's ``evaluate_results.py`` plus strict F1/EM.

    Args:
        rows: the file's rows (see the module docstring).
        topk: keep the ``topk`` most frequent entries of list predictions (RoG's ``--top_k``); ``-1`` keeps all.
        n_bins: bins of ECE/MCE.

    Returns:
        ``(results, detailed, pairs)``: every metric ×100 (``acc hit hit1 f1 precision recall strict_f1
        strict_precision strict_recall em``, plus ``ece mce brier`` with confidences) with the counts
        ``n_questions`` (scored), ``n_empty_gold`` and ``n_confidences``; one detailed dict per row (rows with an
        empty ground truth, on which RoG crashes, get null scores and are left out of every mean); and the
        (confidence, correct) pairs.

    Raises:
        AnswerError: a row that cannot be scored, or no row with a gold answer.

    Example:
        >>> from types import SimpleNamespace
        >>> rows = [SimpleNamespace(id="q1", prediction="Paris\\nLyon", ground_truth=["Paris"], confidence=None, line=1)]
        >>> results, detailed, _ = score_predictions(rows)
        >>> results["hit"], results["f1"], detailed[0]["precision"]
        (100.0, 66.66666666666666, 0.5)
    """
    scores: dict[str, list[float]] = {k: [] for k in ALL_KEYS}
    pairs = calibration_pairs(rows, topk)
    detailed: list[dict[str, Any]] = []
    n_empty = 0
    for row in rows:
        out: dict[str, Any] = {"id": row.id, "prediction": prepare_prediction(row.prediction, topk)}
        out["ground_truth"] = row.ground_truth
        if not row.ground_truth:
            n_empty += 1
            out.update({k: None for k in DETAILED_KEYS})
            out["skipped"] = "empty ground_truth"
        else:
            s = answer_scores(row.prediction, row.ground_truth, topk)
            for k in ALL_KEYS:
                scores[k].append(s[k])
            out.update({k: s[k] for k in DETAILED_KEYS})
        detailed.append(out)
    n = len(scores["acc"])
    if n == 0:
        raise AnswerError(f"no question with a non-empty ground truth to evaluate ({n_empty} rows)")
    results: dict[str, float] = {k: sum(v) * 100 / len(v) for k, v in scores.items()}
    conf_all, correct_all = pairs
    if conf_all:
        results["ece"] = expected_calibration_error(conf_all, correct_all, n_bins=n_bins).item() * 100
        results["mce"] = maximum_calibration_error(conf_all, correct_all, n_bins=n_bins).item() * 100
        results["brier"] = brier_score(conf_all, correct_all).item() * 100
    results.update(n_questions=n, n_empty_gold=n_empty, n_confidences=len(conf_all))
    return results, detailed, pairs
