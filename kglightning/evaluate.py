"""The ``evaluate`` command: score a predictions jsonl the way RoG does, plus strict F1/EM and calibration.

Input, one JSON object per line, in the RoG / GNN-RAG form::

    {"id": "WebQTest-0", "question": "...", "prediction": "Paris\\nLyon" or ["Paris", "Lyon"],
     "ground_truth": ["Paris"], "confidence": [0.9, 0.2] or {"Paris": 0.9, "Lyon": 0.2}}

``ground_truth`` falls back to ``answer`` (kglightning's record format). ``confidence`` is optional: a list aligned
with the list ``prediction`` (or with the lines of a string prediction), or a dict answer → confidence. Blank lines
are skipped; any other malformed line raises :class:`~kglightning.data.records.RecordError` naming the file, the
line and the field (RoG prints such lines and silently skips them).

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
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass
class PredictionLine:
    """One validated line of a predictions file."""

    id: Any
    prediction: str | list[str]
    ground_truth: list[str]
    confidence: list[float] | dict[str, float] | None
    line: int


def _unit_float(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and 0 <= value <= 1


def parse_prediction_line(text: str, source: str = "<predictions>", line: int | None = None) -> PredictionLine:
    """Validate one jsonl line; raise :class:`RecordError` naming ``source``, ``line`` and the field.

    Example:
        >>> parse_prediction_line('{"id": "q1", "prediction": "a\\\\nb", "answer": ["a"]}').ground_truth
        ['a']
        >>> try:
        ...     parse_prediction_line('{"id": "q1", "prediction": 3, "answer": ["a"]}', "p.jsonl", 7)
        ... except RecordError as e:
        ...     print(e)
        p.jsonl:7: field 'prediction' expected a string or a list of strings, got int
    """

    def err(message: str, name: str | None = None) -> RecordError:
        return RecordError(message, source=source, line=line, field=name)

    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise err(f"invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(data, dict):
        raise err(f"expected a JSON object, got {type(data).__name__}")
    if "id" not in data:
        raise err("missing required field", "id")
    if isinstance(data["id"], bool) or not isinstance(data["id"], (str, int)):
        raise err(f"expected a string, got {data['id']!r}", "id")
    if "prediction" not in data:
        raise err("missing required field", "prediction")
    pred = data["prediction"]
    if not isinstance(pred, str):
        if not isinstance(pred, list) or not all(isinstance(p, str) for p in pred):
            raise err(f"expected a string or a list of strings, got {type(pred).__name__}", "prediction")
    name = "ground_truth" if "ground_truth" in data else "answer"
    if name not in data:
        raise err("missing required field (or its fallback 'answer')", "ground_truth")
    gold = data[name]
    if isinstance(gold, str):  # as kglightning.data.records: a bare string is one answer
        gold = [gold]
    if not isinstance(gold, list) or not all(isinstance(a, str) for a in gold):
        raise err(f"expected a list of strings, got {type(gold).__name__}", name)
    conf = data.get("confidence")
    if isinstance(conf, dict):
        bad = [k for k, v in conf.items() if not _unit_float(v)]
        if bad:
            raise err(f"value for {bad[0]!r} is {conf[bad[0]]!r}, expected a number in [0, 1]", "confidence")
    elif isinstance(conf, list):
        n = len(pred.split("\n")) if isinstance(pred, str) else len(pred)
        if len(conf) != n:
            raise err(f"has {len(conf)} values for {n} predictions", "confidence")
        bad_i = [i for i, v in enumerate(conf) if not _unit_float(v)]
        if bad_i:
            raise err(f"item {bad_i[0]} is {conf[bad_i[0]]!r}, expected a number in [0, 1]", "confidence")
    elif conf is not None:
        raise err(f"expected a list of numbers or an object answer -> number, got {type(conf).__name__}", "confidence")
    return PredictionLine(data["id"], pred, gold, conf, line if line is not None else 0)


def read_predictions(path: str | Path) -> list[PredictionLine]:
    """Read and validate a predictions jsonl file (blank lines are skipped)."""
    path = Path(path)
    out = []
    with path.open(encoding="utf-8") as f:
        for i, text in enumerate(f, start=1):
            if text.strip():
                out.append(parse_prediction_line(text, source=str(path), line=i))
    return out


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
    predictions: str | Path, output: str | Path | None = None, topk: int = -1, n_bins: int = 10
) -> dict[str, float]:
    """Score a predictions jsonl, write ``eval_result.txt``, ``detailed_eval_result.jsonl`` (and ``reliability.png``).

    Args:
        predictions: the jsonl file (see the module docstring for the format).
        output: folder for the outputs; defaults to the folder of ``predictions``.
        topk: keep the ``topk`` most frequent entries of list predictions (RoG's ``--top_k``); ``-1`` keeps all.
        n_bins: bins for ECE/MCE and the reliability diagram.

    Returns:
        Every metric ×100 as in ``eval_result.txt`` (keys ``acc hit hit1 f1 precision recall strict_f1
        strict_precision strict_recall em``, plus ``ece mce brier`` with confidences), and the counts
        ``n_questions`` (scored), ``n_empty_gold`` and ``n_confidences``.

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
    out_dir = Path(output) if output is not None else predictions.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = f"_top_{topk}" if topk > 0 else ""
    records = read_predictions(predictions)

    scores: dict[str, list[float]] = {k: [] for k in ALL_KEYS}
    conf_all, correct_all = calibration_pairs(records, topk, source=str(predictions))
    n_empty = 0
    with (out_dir / f"detailed_eval_result{suffix}.jsonl").open("w", encoding="utf-8") as f:
        for rec in records:
            scored = prepare_prediction(rec.prediction, topk)
            row: dict[str, Any] = {"id": rec.id, "prediction": scored, "ground_truth": rec.ground_truth}
            if not rec.ground_truth:
                n_empty += 1
                row.update({k: None for k in ("acc", "hit", "hit1", "f1", "precision", "recall", "strict_f1", "em")})
                row["skipped"] = "empty ground_truth"
            else:
                s = answer_scores(rec.prediction, rec.ground_truth, topk)
                for k in ALL_KEYS:
                    scores[k].append(s[k])
                row.update({k: s[k] for k in ("acc", "hit", "hit1", "f1", "precision", "recall", "strict_f1", "em")})
            f.write(json.dumps(row, ensure_ascii=False) + "\n")

    n = len(scores["acc"])
    if n == 0:
        raise ValueError(f"{predictions}: no question with a non-empty ground truth to evaluate")
    results: dict[str, float] = {k: sum(v) * 100 / len(v) for k, v in scores.items()}
    if conf_all:
        results["ece"] = expected_calibration_error(conf_all, correct_all, n_bins=n_bins).item() * 100
        results["mce"] = maximum_calibration_error(conf_all, correct_all, n_bins=n_bins).item() * 100
        results["brier"] = brier_score(conf_all, correct_all).item() * 100
        plot_reliability_diagram(
            conf_all, correct_all, out_dir / f"reliability{suffix}.png", n_bins=n_bins, title=predictions.name
        )
    text = format_result(results)
    (out_dir / f"eval_result{suffix}.txt").write_text(text, encoding="utf-8")
    print(text, end="")
    if n_empty:
        print(f"({n} questions scored; {n_empty} with an empty ground truth left out)")
    results.update(n_questions=n, n_empty_gold=n_empty, n_confidences=len(conf_all))
    return results


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m kglightning evaluate``."""
    p = argparse.ArgumentParser(prog="kglightning evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--predictions", required=True, type=Path, help="predictions jsonl (RoG / GNN-RAG format)")
    p.add_argument("--output", type=Path, default=None, help="output folder (default: the predictions' folder)")
    p.add_argument("--topk", "--top_k", type=int, default=-1, help="keep the k most frequent list predictions")
    p.add_argument("--n_bins", type=int, default=10, help="calibration bins")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the command; returns 0, or 2 with a message on stderr when the input is malformed or missing."""
    args = build_parser().parse_args(argv)
    try:
        evaluate_predictions(args.predictions, args.output, topk=args.topk, n_bins=args.n_bins)
    except (RecordError, ValueError, OSError) as e:
        print(f"kglightning evaluate: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
