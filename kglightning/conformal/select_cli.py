"""The ``select`` command: keep the answers of a scored predictions file under a guarantee, or check a rule on data.

Two modes (the file format is in :mod:`kglightning.conformal.selection_io`)::

    # calibrate on labelled questions, keep the test answers
    kglightning select --calibration cal.jsonl --predictions test.jsonl --rule top --alpha 0.1 --group-by grounding
    # check rules on a labelled pool: 20 random calibration/test splits by question, a report with a plot
    kglightning select --pool scored.jsonl --repeats 20 --rule fdr top kept_rate question --alpha 0.1 0.2 \\
        --group-by grounding --report-dir outputs/trust/check

The first writes each row with ``kept`` (the answers kept, in their order), ``kept_scores``, ``dropped``,
``abstained`` (no answer kept) and ``selection`` (the rule, alpha and the row's group cut), default
``<predictions>.selected.jsonl``, and a summary JSON beside it with each group's calibration size, ``too_small`` flag
and, when the test rows are labelled, what the selection achieved. Input problems exit with status 2 and one
``FILE:LINE: field 'NAME' ...`` line on stderr before anything is written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kglightning.data.predictions import add_on_bad_record_argument
from kglightning.data.records import RecordError
from kglightning.fileio import atomic_write, check_outputs_apart, write_text_atomic
from kglightning.help_format import DefaultsHelpFormatter

if TYPE_CHECKING:
    from kglightning.conformal.selection_io import ScoredFile

# The modules that compute (torch) are imported in the functions that use them: `select --help` starts at once.

log = logging.getLogger(__name__)


#: what ``--pool`` writes into ``--report-dir``
REPORT_FILES = ("report.md", "report.json", "selection.png", "splits.json")
#: the rules of :class:`~kglightning.conformal.selection.AnswerSelector` (its ``RULES``; a test keeps them equal)
RULES = ("fdr", "top", "kept_rate", "question")


def _read(path: str, args: argparse.Namespace) -> ScoredFile:
    from kglightning.conformal.selection_io import read_scored

    return read_scored(path, args.score, args.sense, args.group_by, args.on_bad_record)


def apply_selection(args: argparse.Namespace) -> dict[str, Any]:
    """Calibrate on ``--calibration``, select on ``--predictions``, write the rows and the summary."""
    from kglightning.conformal.selection import AnswerSelector
    from kglightning.conformal.selection_io import json_number, labelled_part, selected_rows
    from kglightning.metrics.functional.selection import grouped_selection_metrics

    out = Path(args.output) if args.output else Path(args.predictions).with_suffix(".selected.jsonl")
    check_outputs_apart([out, out.with_suffix(".summary.json")], [args.calibration, args.predictions])
    if Path(args.calibration).exists() and Path(args.predictions).exists():
        if os.path.samefile(args.calibration, args.predictions):
            raise ValueError(f"--calibration and --predictions are the same file ({args.predictions}): the guarantee "
                             "needs calibration questions apart from the questions selected on")  # fmt: skip
    cal, test = _read(args.calibration, args), _read(args.predictions, args)
    shared = {str(r["id"]) for r in cal.rows} & {str(r["id"]) for r in test.rows}
    if shared:
        log.warning("%s and %s share %d question ids (e.g. %s): a question in both is calibrated on and selected on, "
                    "and the guarantee does not hold for it", args.calibration, args.predictions, len(shared),
                    sorted(shared)[0])  # fmt: skip
    cal_answers = labelled_part(cal, args.calibration)
    selector = AnswerSelector(
        args.rule[0], args.alpha[0], args.delta, args.min_calibration, args.grid, args.start, args.chains, args.seed
    )
    sel = selector.select(cal_answers, test.answers)
    rows = selected_rows(test.rows, test.names, test.answers, sel, selector)
    summary: dict[str, Any] = {
        "rule": selector.rule,
        "alpha": selector.alpha,
        "delta": selector.delta,
        "groups": {g: vars(s) for g, s in sel.groups.items()},
        "n_calibration_skipped": len(cal.skipped),
        "n_calibration_no_gold": len(cal.no_gold_lines),
        "n_test_skipped": len(test.skipped),
        "n_test_no_answer": test.no_answer_rows,
        "output": str(out),
    }
    if test.labelled:
        t = test.answers
        summary["achieved"] = grouped_selection_metrics(sel.keep, t.hallucinated, t.question, t.group)
    elif test.labelled_rows:
        log.warning(
            "%s: %d of %d rows have labels, so what the selection achieved is not reported (first unlabelled: "
            "line %s)", args.predictions, test.labelled_rows, len(test.rows), test.first_unlabelled,
        )  # fmt: skip
        summary["labelled_rows"] = test.labelled_rows
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out) as f:
        f.writelines(json.dumps(json_number(r), allow_nan=False) + "\n" for r in rows)
    write_text_atomic(
        out.with_suffix(".summary.json"), json.dumps(json_number(summary), indent=2, allow_nan=False) + "\n"
    )
    return summary


def default_report_dir(pool: str | os.PathLike) -> Path:
    """Where ``select --pool POOL`` writes its report without ``--report-dir``: a folder of ``outputs/selection``
    named as the pool's file without its suffix (``hallucination_predictions_test.jsonl``:
    ``outputs/selection/hallucination_predictions_test``)."""
    return Path("outputs/selection") / Path(pool).stem


def check_rules(args: argparse.Namespace) -> Path:
    """Repeated random splits of ``--pool``; write the report."""
    from kglightning.conformal.selection_io import json_number, labelled_part
    from kglightning.conformal.selection_report import repeated_selection, summarize, write_report

    out = Path(args.report_dir) if args.report_dir else default_report_dir(args.pool)
    check_outputs_apart([out / name for name in REPORT_FILES], [args.pool])
    pool = _read(args.pool, args)
    answers = labelled_part(pool, args.pool, "pool")
    kw = {"grid": args.grid, "start": args.start, "chains": args.chains, "min_calibration": args.min_calibration}
    rows = repeated_selection(answers, args.rule, args.alpha, args.delta, args.repeats, args.calibration_share,
                              args.seed, args.one_per_question, **kw)  # fmt: skip
    summary = summarize(rows, args.delta)
    title = f"Selection on {Path(args.pool).name}: {args.repeats} random calibration/test splits by question"
    write_report(summary, out, title, args.delta, pool=args.pool, repeats=args.repeats, seed=args.seed,
                 calibration_share=args.calibration_share, group_by=args.group_by, score=args.score,
                 one_per_question=args.one_per_question, no_gold_rows=len(pool.no_gold_lines))  # fmt: skip
    write_text_atomic(out / "splits.json", json.dumps(json_number(rows), allow_nan=False) + "\n")
    return out


def _shift(info: dict[str, Any]) -> str:
    c, t = info["calibration_lengths"], info["test_lengths"]
    return (
        f"calibration and test questions have answer lists of different lengths, p = {info['length_pvalue']:.2g}: "
        f"{c['mean']:.2f} against {t['mean']:.2f} answers on average; the guarantee assumes them drawn alike"
    )


def build_parser(prog: str = "kglightning select") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter, prog=prog, description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--predictions", help="the scored predictions jsonl whose answers to select (with --calibration)")
    mode.add_argument("--pool", help="a labelled scored jsonl to check the rules on, by repeated random splits")
    p.add_argument("--calibration", help="labelled scored jsonl of the calibration questions (with --predictions)")
    p.add_argument("--rule", nargs="+", default=["top"], choices=RULES,
                   help="fdr: expected hallucinated share of the kept answers <= alpha (answers exchangeable); "
                        "top: the same on each question's best answer, at most one kept per question (questions "
                        "exchangeable); "
                        "kept_rate: the hallucinated share of the answers its cut keeps over the population of "
                        "questions, each weighing one, <= alpha with probability >= 1 - delta (Learn-Then-Test); "
                        "question: P(a question keeps a "
                        "hallucinated answer) <= alpha")  # fmt: skip
    p.add_argument("--alpha", nargs="+", type=float, default=[0.1], help="level(s) in (0, 1)")
    p.add_argument("--delta", type=float, default=0.1, help="kept_rate: probability the bound may fail")
    p.add_argument(
        "--group-by",
        default=None,
        help="key of a per-answer list or per-row value (dotted for nested); one selection per group (default: none, one for all)",
    )
    p.add_argument("--score", default="hallucination_logit",
                   help="the per-answer score column (the detector's logits rank its answers without the ties of probabilities near 1)")  # fmt: skip
    p.add_argument("--sense", default="hallucination", choices=("hallucination", "confidence"),
                   help="hallucination: higher = more likely wrong; confidence: higher = more likely right")  # fmt: skip
    p.add_argument(
        "--min-calibration",
        type=int,
        default=None,
        help="fewest calibration questions a group needs (default: the rule's floor at this alpha, calibration_floor)",
    )
    p.add_argument("--grid", type=int, default=100, help="kept_rate: thresholds tested")
    p.add_argument("--start", type=float, default=0.1, help="kept_rate: share of test answers the strictest keeps")
    p.add_argument("--chains", type=int, default=4, help="kept_rate: fixed sequences, Bonferroni over them")
    p.add_argument("--seed", type=int, default=0, help="tie-breaking and split seed")
    p.add_argument("--output", default=None, help="selected rows (default <predictions>.selected.jsonl)")
    p.add_argument("--repeats", type=int, default=20, help="--pool: random splits")
    p.add_argument("--calibration-share", type=float, default=0.5, help="--pool: share of questions calibrating")
    p.add_argument("--one-per-question", action="store_true",
                   help="--pool: keep one random answer per question in every split (answers then exchangeable)")  # fmt: skip
    p.add_argument("--report-dir", default=None,
                   help="--pool: where report.md/json/png go (default: outputs/selection/ and the pool's file name "
                   "without .jsonl, so that the reports of different pools or splits never share a file)")  # fmt: skip
    add_on_bad_record_argument(p)
    return p


def main(argv: list[str] | None = None, prog: str = "kglightning select") -> int:
    args = build_parser(prog).parse_args(argv)
    from kglightning.conformal.selection import CLUSTERED_NOTE, LENGTH_LEVEL

    try:
        if args.predictions is not None:
            if args.calibration is None:
                raise ValueError("--predictions needs --calibration")
            if len(args.rule) > 1 or len(args.alpha) > 1:
                raise ValueError("--predictions takes one --rule and one --alpha (several are for --pool)")
            s = apply_selection(args)
            for g, info in s["groups"].items():
                flag = " (too few calibration questions: nothing kept)" if info["too_small"] else ""
                shift = info["length_pvalue"] is not None and info["length_pvalue"] < LENGTH_LEVEL
                flag += f" (WARNING: {_shift(info)})" if shift else ""
                flag += (
                    f" (WARNING: its questions carry several answers; {CLUSTERED_NOTE})"
                    if info.get("clustered")
                    else ""
                )
                print(f"group {g}: kept {info['n_kept']} of {info['n_test']} answers{flag}")
            if "achieved" in s:
                a = s["achieved"]["all"]
                print(f"test: FDR {a['fdr']:.4f}, power {a['power']:.4f}, abstention {a['abstention']:.4f}")
            print(f"wrote {s['output']}")
        else:
            out = check_rules(args)
            print((out / "report.md").read_text())
            print(f"wrote {out}/{', '.join(REPORT_FILES)}")
    except (RecordError, ValueError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0
