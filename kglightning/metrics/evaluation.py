"""The files of an evaluation: ``eval_result.txt``, ``detailed_eval_result.jsonl`` and ``reliability.png``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kglightning.fileio import atomic_write, write_text_atomic
from kglightning.metrics.functional.evaluation import score_predictions
from kglightning.metrics.plots import plot_reliability_diagram

_ROG_LINE = (
    ("Accuracy", "acc"),
    ("Hit", "hit"),
    ("Hit1", "hit1"),
    ("F1", "f1"),
    ("Precision", "precision"),
    ("Recall", "recall"),
)
_STRICT_LINE = (
    ("Strict-F1", "strict_f1"),
    ("Strict-Precision", "strict_precision"),
    ("Strict-Recall", "strict_recall"),
    ("EM", "em"),
)
_CALIB_LINE = (("ECE", "ece"), ("MCE", "mce"), ("Brier", "brier"))


def format_result(results: dict[str, float]) -> str:
    """The text of ``eval_result.txt``: RoG's line (with GNN-RAG's ``Hit1``), the strict line, and the calibration
    line when there are confidences; values ×100, printed as ``str(float)`` like RoG.

    Example:
        >>> from kglightning.metrics.functional.qa import ALL_KEYS
        >>> print(format_result({k: 50.0 for k in ALL_KEYS}).splitlines()[0])
        Accuracy: 50.0 Hit: 50.0 Hit1: 50.0 F1: 50.0 Precision: 50.0 Recall: 50.0
    """
    lines = [
        " ".join(f"{label}: {results[key]}" for label, key in _ROG_LINE),
        " ".join(f"{label}: {results[key]}" for label, key in _STRICT_LINE),
    ]
    if "ece" in results:
        lines.append(" ".join(f"{label}: {results[key]}" for label, key in _CALIB_LINE))
    return "\n".join(lines) + "\n"


def write_evaluation(
    rows: Sequence[Any],
    out_dir: str | Path,
    topk: int = -1,
    n_bins: int = 10,
    title: str = "",
    out: dict[str, Any] | None = None,
    prefix: str = "",
) -> dict[str, float]:
    """Score ``rows`` (:func:`~kglightning.metrics.functional.evaluation.score_predictions`) and write the files.

    Everything is scored before the first file (or ``out_dir``) is created, so a row that cannot be scored leaves
    nothing behind. With ``topk > 0`` the names get a ``_top_{topk}`` suffix.

    Args:
        rows: the predictions file's rows.
        out_dir: the folder of the files.
        topk: keep the ``topk`` most frequent entries of list predictions; ``-1`` keeps all.
        n_bins: calibration bins.
        title: title of the reliability diagram.
        out: if given, gets ``detailed`` (the per-question rows) and ``pairs`` (the (confidence, correct) pairs).
        prefix: put before each file's name (:func:`evaluation_files`).

    Returns:
        The results of ``score_predictions``.
    """
    results, detailed, (conf, correct) = score_predictions(rows, topk, n_bins)
    if out is not None:
        out.update(detailed=detailed, pairs=(conf, correct))
    files = evaluation_files(out_dir, topk, prefix)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    with atomic_write(files["detailed"]) as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in detailed)
    if conf:
        plot_reliability_diagram(conf, correct, files["reliability"], n_bins=n_bins, title=title)
    write_text_atomic(files["result"], format_result(results))
    return results


def evaluation_files(out_dir: str | Path, topk: int = -1, prefix: str = "") -> dict[str, Path]:
    """The files :func:`write_evaluation` writes into ``out_dir`` (``result``, ``detailed``, ``reliability``); with
    ``topk > 0`` their names get a ``_top_{topk}`` suffix, and each name starts with ``prefix``
    (:func:`files_prefix`: the predictions file's own name, so that two splits' files in one folder stay apart)."""
    suffix = f"_top_{topk}" if topk > 0 else ""
    out_dir = Path(out_dir)
    return {"result": out_dir / f"{prefix}eval_result{suffix}.txt",
            "detailed": out_dir / f"{prefix}detailed_eval_result{suffix}.jsonl",
            "reliability": out_dir / f"{prefix}reliability{suffix}.png"}  # fmt: skip


def files_prefix(predictions: str | Path) -> str:
    """What :func:`evaluation_files` puts before the names of a predictions file's evaluation: nothing for RoG's
    ``predictions.jsonl`` (its files keep RoG's names), else the file's stem and a dot, so that
    ``predictions_validation.jsonl`` and ``predictions_test.jsonl`` in one folder get files of their own.

    Example:
        >>> files_prefix("out/predictions.jsonl"), files_prefix("out/predictions_test.jsonl")
        ('', 'predictions_test.')
    """
    stem = Path(predictions).name.removesuffix(".jsonl")
    return "" if stem == "predictions" else f"{stem}."
