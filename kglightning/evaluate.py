"""The ``evaluate`` command: score a predictions jsonl the way RoG does, plus strict F1/EM and calibration.

Input, one JSON object per line, in the RoG / GNN-RAG form::

    {"id": "WebQTest-0", "question": "...", "prediction": "Paris\\nLyon" or ["Paris", "Lyon"],
     "ground_truth": ["Paris"], "confidence": [0.9, 0.2] or {"Paris": 0.9, "Lyon": 0.2}}

``ground_truth`` falls back to ``answer`` (kglightning's record format). ``confidence`` is optional: a list aligned
with the list ``prediction`` (or with the lines of a string prediction), or a dict answer → confidence. The file is
read by :func:`kglightning.data.predictions.read_predictions`: blank lines are skipped; a malformed line (not UTF-8,
not JSON, a bad field, a repeated ``id``) or an empty file raises :class:`~kglightning.data.records.RecordError`
naming the file, the line and the field (RoG prints such lines and silently skips them), or, with
``on_bad_record="skip"`` (``--on-bad-record skip``), is left out, logged and counted. All input is checked before
any output is written, so a failed run leaves no (empty) result files behind.

Output, in ``output`` (default: the folder of the predictions file; RoG instead derives names by replacing
``predictions.jsonl`` in the path, which overwrites its input when the file is named otherwise):

* ``eval_result.txt``: RoG's line with GNN-RAG's ``Hit1`` inserted after ``Hit``, each value printed as
  ``str(sum(scores) * 100 / n)`` like RoG; a line with the strict set-based scores; and, when confidences exist,
  ``ECE: … MCE: … Brier: …`` (×100 too);
* ``detailed_eval_result.jsonl``: per question its id, the scored prediction list, the ground truth and its scores
  (RoG's misspelt ``precission`` key is written as ``precision``);
* ``reliability.png`` when confidences exist.

With ``topk > 0`` the names get a ``_top_{topk}`` suffix (RoG's code forgot the ``f`` of the f-string and writes a
literal ``{topk}``). Questions with an empty gold list, on which RoG crashes, are left out of every mean, counted in
``n_empty_gold``, and written to the detailed file with null scores.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Literal

from kglightning.data.predictions import PredictionLine, read_predictions
from kglightning.data.records import RecordError
from kglightning.metrics.functional.calibration import (
    brier_score,
    expected_calibration_error,
    maximum_calibration_error,
)
from kglightning.metrics.functional.qa import ALL_KEYS, answer_correctness, answer_scores, prepare_prediction
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
_DETAILED_KEYS = ("acc", "hit", "hit1", "f1", "precision", "recall", "strict_f1", "em")


def confidence_pairs(rec: PredictionLine, scored: list[str]) -> tuple[list[float], list[bool]]:
    """Per scored proposed answer (empty ones skipped): its confidence and whether it RoG-matches a gold.

    A list ``confidence`` aligned with a list prediction gives each distinct answer the confidence of its first
    occurrence (RoG de-duplicates list predictions); with a string prediction it aligns with the lines.
    """
    if rec.confidence is None:
        return [], []
    if isinstance(rec.confidence, list) and isinstance(rec.prediction, str):
        items = [(p, c) for p, c in zip(rec.prediction.split("\n"), rec.confidence) if p.strip()]
    else:
        if isinstance(rec.confidence, dict):
            table = rec.confidence
        else:
            table = {}
            for p, c in zip(rec.prediction, rec.confidence):
                table.setdefault(p, c)
        items = []
        for p in scored:
            if not p.strip():
                continue
            if p not in table:
                raise RecordError(
                    f"no confidence for predicted answer {p!r}",
                    source="<predictions>",
                    line=rec.line,
                    field="confidence",
                )
            items.append((p, table[p]))
    correct = answer_correctness([p for p, _ in items], rec.ground_truth)
    return [float(c) for _, c in items], correct


def calibration_pairs(
    records: list[PredictionLine], topk: int = -1, source: str = "<predictions>"
) -> tuple[list[float], list[bool]]:
    """Every scored answer's (confidence, correct) pair over the questions with a non-empty ground truth.

    These are the pairs behind ECE/MCE/Brier and the reliability diagram of :func:`evaluate_predictions`.
    """
    conf_all: list[float] = []
    correct_all: list[bool] = []
    for rec in records:
        if not rec.ground_truth:
            continue
        try:
            c, ok = confidence_pairs(rec, prepare_prediction(rec.prediction, topk))
        except RecordError as e:
            raise RecordError(e.reason, source=source, line=rec.line, field=e.field) from None
        conf_all += c
        correct_all += ok
    return conf_all, correct_all


def format_result(results: dict[str, float]) -> str:
    """The text of ``eval_result.txt`` (see the module docstring).

    Example:
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


def evaluate_predictions(
    predictions: str | Path,
    output: str | Path | None = None,
    topk: int = -1,
    n_bins: int = 10,
    on_bad_record: Literal["raise", "skip"] = "raise",
) -> dict[str, float]:
    """Score a predictions jsonl, write ``eval_result.txt``, ``detailed_eval_result.jsonl`` (and ``reliability.png``).

    Everything is read, validated and scored before the first output file (or the output folder) is created.

    Args:
        predictions: the jsonl file (see the module docstring for the format).
        output: folder for the outputs; defaults to the folder of ``predictions``.
        topk: keep the ``topk`` most frequent entries of list predictions (RoG's ``--top_k``); ``-1`` keeps all.
        n_bins: bins for ECE/MCE and the reliability diagram.
        on_bad_record: ``"raise"`` on the first malformed line, or ``"skip"`` such lines (logged and counted).

    Returns:
        Every metric ×100 as in ``eval_result.txt`` (keys ``acc hit hit1 f1 precision recall strict_f1
        strict_precision strict_recall em``, plus ``ece mce brier`` with confidences), and the counts
        ``n_questions`` (scored), ``n_empty_gold``, ``n_confidences`` and ``n_skipped`` (malformed lines left out).

    Raises:
        RecordError: a malformed line (naming file, line and field), an empty file, or no question with a gold answer.
        FileNotFoundError: ``predictions`` does not exist.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "predictions.jsonl").write_text(
        ...     '{"id": "q1", "prediction": "Paris\\\\nLyon", "ground_truth": ["Paris"]}\\n')
        >>> r = evaluate_predictions(d / "predictions.jsonl")
        Accuracy: 100.0 Hit: 100.0 Hit1: 100.0 F1: 66.66666666666666 Precision: 50.0 Recall: 100.0
        Strict-F1: 66.66666666666666 Strict-Precision: 50.0 Strict-Recall: 100.0 EM: 0.0
        >>> sorted(p.name for p in d.iterdir())
        ['detailed_eval_result.jsonl', 'eval_result.txt', 'predictions.jsonl']
    """
    predictions = Path(predictions)
    suffix = f"_top_{topk}" if topk > 0 else ""
    records = read_predictions(predictions, on_bad_record=on_bad_record)

    scores: dict[str, list[float]] = {k: [] for k in ALL_KEYS}
    conf_all, correct_all = calibration_pairs(records, topk, source=str(predictions))
    rows: list[dict[str, Any]] = []
    n_empty = 0
    for rec in records:
        row: dict[str, Any] = {"id": rec.id, "prediction": prepare_prediction(rec.prediction, topk)}
        row["ground_truth"] = rec.ground_truth
        if not rec.ground_truth:
            n_empty += 1
            row.update({k: None for k in _DETAILED_KEYS})
            row["skipped"] = "empty ground_truth"
        else:
            s = answer_scores(rec.prediction, rec.ground_truth, topk)
            for k in ALL_KEYS:
                scores[k].append(s[k])
            row.update({k: s[k] for k in _DETAILED_KEYS})
        rows.append(row)
    n = len(scores["acc"])
    if n == 0:
        raise RecordError(
            f"no question with a non-empty ground truth to evaluate ({n_empty} rows)", source=str(predictions)
        )
    results: dict[str, float] = {k: sum(v) * 100 / len(v) for k, v in scores.items()}
    if conf_all:
        results["ece"] = expected_calibration_error(conf_all, correct_all, n_bins=n_bins).item() * 100
        results["mce"] = maximum_calibration_error(conf_all, correct_all, n_bins=n_bins).item() * 100
        results["brier"] = brier_score(conf_all, correct_all).item() * 100

    out_dir = Path(output) if output is not None else predictions.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / f"detailed_eval_result{suffix}.jsonl").open("w", encoding="utf-8") as f:
        f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if conf_all:
        plot_reliability_diagram(
            conf_all, correct_all, out_dir / f"reliability{suffix}.png", n_bins=n_bins, title=predictions.name
        )
    text = format_result(results)
    (out_dir / f"eval_result{suffix}.txt").write_text(text, encoding="utf-8")
    print(text, end="")
    if n_empty:
        print(f"({n} questions scored; {n_empty} with an empty ground truth left out)")
    if records.skipped:
        print(f"({len(records.skipped)} bad rows skipped, see the warnings above)")
    results.update(n_questions=n, n_empty_gold=n_empty, n_confidences=len(conf_all), n_skipped=len(records.skipped))
    return results


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m kglightning evaluate``."""
    p = argparse.ArgumentParser(prog="kglightning evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--predictions", required=True, type=Path, help="predictions jsonl (RoG / GNN-RAG format)")
    p.add_argument("--output", type=Path, default=None, help="output folder (default: the predictions' folder)")
    p.add_argument("--topk", "--top_k", type=int, default=-1, help="keep the k most frequent list predictions")
    p.add_argument("--n_bins", type=int, default=10, help="calibration bins")
    p.add_argument(
        "--on-bad-record",
        "--on_bad_record",
        choices=("raise", "skip"),
        default="raise",
        help="stop at the first malformed line (default) or skip such lines, each logged and counted",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns 0, or 2 with a one-line message on stderr when the input is malformed or missing."""
    args = build_parser().parse_args(argv)
    try:
        evaluate_predictions(
            args.predictions, args.output, topk=args.topk, n_bins=args.n_bins, on_bad_record=args.on_bad_record
        )
    except (RecordError, ValueError, OSError) as e:
        print(f"kglightning evaluate: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
