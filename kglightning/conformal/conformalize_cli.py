"""The ``conformalize`` command's command line (:func:`main`); the sets are computed by
:func:`kglightning.conformal.offline.conformalize`, imported once the arguments are read, so ``--help`` starts at
once."""

from __future__ import annotations

import argparse
import sys

from kglightning.data.predictions import add_on_bad_record_argument
from kglightning.data.records import RecordError
from kglightning.help_format import DefaultsHelpFormatter


def build_parser(prog: str = "kglightning conformalize") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        formatter_class=DefaultsHelpFormatter,
        prog=prog,
        description="Split-conformal answer sets from a calibration and a test predictions jsonl (with confidences).",
    )
    p.add_argument("--calibration", required=True, help="predictions jsonl of the calibration questions")
    p.add_argument("--predictions", required=True, help="predictions jsonl to add sets to")
    p.add_argument("--alpha", type=float, required=True, help="miscoverage level in (0, 1)")
    p.add_argument("--output", default=None,
                   help="output jsonl (default: <predictions>.conformal.jsonl); its summary (.summary.json) and, when "
                   "the test rows have gold answers, a plot of the coverage against the target (.png) go beside it")  # fmt: skip
    p.add_argument(
        "--group-by",
        default=None,
        help="a per-question key (dotted for nested): one qhat per group (default: none, one qhat for all)",
    )
    add_on_bad_record_argument(p)
    return p


def main(argv: list[str] | None = None, prog: str = "kglightning conformalize") -> int:
    """Run the command; returns 0, or 2 with a one-line message on stderr when the input is malformed or missing."""
    args = build_parser(prog).parse_args(argv)
    from kglightning.conformal.offline import conformalize

    try:
        s = conformalize(args.calibration, args.predictions, args.alpha, args.output, args.on_bad_record, args.group_by)
    except (RecordError, ValueError, OSError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    qhat = "per group" if s.get("groups") else s["qhat"] if s["qhat"] is None else format(s["qhat"], ".6g")
    print(
        f"qhat={qhat} from {s['n_calibration']} calibration questions "
        f"({s['calibration_missed']} with no correct proposed answer)"
    )
    for g, info in s.get("groups", {}).items():
        flag = f" ({info['full_set_reason']}: full sets, flagged)" if info["full_sets"] else ""
        ecr = "" if info["apss"] is None else f", test APSS {info['apss']:.2f}"
        if info["ecr"] is not None:
            ecr = f", test ECR {info['ecr']:.4f}, APSS {info['apss']:.2f}"
        g_qhat = None if info["qhat"] is None else format(info["qhat"], ".6g")
        print(
            f"group {g}: qhat={g_qhat} from {info['n_calibration']} calibration questions "
            f"({info['calibration_missed']} with no correct proposed answer){ecr}{flag}"
        )
    if s["full_sets"] and not s.get("groups"):
        print(f"alpha={args.alpha:g} cannot be reached with these proposals: every set is the full list (flagged)")
    if s["ecr"] is None:
        print(f"test: APSS {s['apss']:.2f} over {s['n_test']} questions (none has gold answers: no ECR)")
    elif s["n_gold"] == s["n_test"]:
        print(f"test: ECR {s['ecr']:.4f}, APSS {s['apss']:.2f} over {s['n_test']} questions")
    else:
        print(
            f"test: ECR {s['ecr']:.4f} over the {s['n_gold']} questions with gold answers, APSS {s['apss']:.2f} "
            f"over {s['n_test']} questions"
        )
    n_skipped = s["n_calibration_skipped"] + s["n_test_skipped"]
    if n_skipped:
        print(
            f"({n_skipped} bad rows skipped: {s['n_calibration_skipped']} calibration, {s['n_test_skipped']} test; "
            "see the warnings above)"
        )
    print(f"wrote {s['output']}")
    if s.get("plot"):
        print(f"wrote {s['plot']} (coverage against the target)")
    return 0
