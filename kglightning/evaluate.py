"""The ``evaluate`` command: score a predictions jsonl the way RoG does, plus strict F1/EM and calibration.

The scoring is :mod:`kglightning.metrics.functional.evaluation`, the output files :mod:`kglightning.metrics.evaluation`;
this module reads the file and runs the command.

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
literal ``{topk}``). A predictions file named other than ``predictions.jsonl`` gives its files its own name first
(``predictions_test.eval_result.txt`` beside ``predictions_test.jsonl``), so that two splits' predictions in one
folder are evaluated without one overwriting the other's results. Questions with an empty gold list, on which RoG crashes, are left out of every mean, counted in
``n_empty_gold``, and written to the detailed file with null scores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Literal

from kglightning.data.predictions import add_on_bad_record_argument, read_predictions
from kglightning.data.records import RecordError
from kglightning.fileio import check_outputs_apart
from kglightning.help_format import DefaultsHelpFormatter

__all__ = ["build_parser", "evaluate_predictions", "main"]


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
        OutputOverInputError: an output file would replace ``predictions``
            (:func:`~kglightning.fileio.check_outputs_apart`).
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
    from kglightning.metrics.evaluation import (  # torch: not at --help
        evaluation_files,
        files_prefix,
        format_result,
        write_evaluation,
    )
    from kglightning.metrics.functional.evaluation import AnswerError

    predictions = Path(predictions)
    out_dir = Path(output) if output is not None else predictions.parent
    prefix = files_prefix(predictions)
    check_outputs_apart(evaluation_files(out_dir, topk, prefix).values(), [predictions])  # before the first write
    records = read_predictions(predictions, on_bad_record=on_bad_record)
    try:
        results = write_evaluation(records, out_dir, topk=topk, n_bins=n_bins, title=predictions.name, prefix=prefix)
    except AnswerError as e:
        raise RecordError(e.reason, source=str(predictions), line=e.line, field=e.field) from None
    print(format_result(results), end="")
    if results["n_empty_gold"]:
        print(
            f"({results['n_questions']} questions scored; {results['n_empty_gold']} with an empty ground truth left out)"
        )
    if records.skipped:
        print(f"({len(records.skipped)} bad rows skipped, see the warnings above)")
    results["n_skipped"] = len(records.skipped)
    return results


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``python -m kglightning evaluate``."""
    p = argparse.ArgumentParser(
        formatter_class=DefaultsHelpFormatter, prog="kglightning evaluate", description=__doc__.split("\n")[0]
    )
    p.add_argument("--predictions", required=True, type=Path, help="predictions jsonl (RoG / GNN-RAG format)")
    p.add_argument("--output", type=Path, default=None, help="output folder (default: the predictions' folder)")
    p.add_argument(
        "--topk", "--top_k", type=int, default=-1, help="keep the k most frequent list predictions (-1: all)"
    )
    p.add_argument("--n_bins", type=int, default=10, help="calibration bins")
    add_on_bad_record_argument(p)
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
