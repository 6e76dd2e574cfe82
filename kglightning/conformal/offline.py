"""The ``conformalize`` command: split-conformal answer sets for any scorer's predictions file.

Any kglightning stage that writes a predictions jsonl with per-answer confidences (the retrieval baseline,
DoublyCal's variants, the refinement loop) or any RoG-format file can be wrapped after the fact. Run the scorer on a
calibration split (e.g. ``--data.init_args.predict_split validation``) and on the test split, then::

    python -m kglightning conformalize --calibration cal.jsonl --predictions test.jsonl --alpha 0.2

A proposed answer's non-conformity is ``1 - confidence``; it is *correct* when it RoG-matches a gold answer (the
``evaluate`` rule). A calibration question's score is the smallest non-conformity of its correct answers (``+inf``
when the scorer proposed none), and ``qhat`` is the exact ``ceil((n+1)(1-alpha))``-th smallest score. Each test
question's set is its proposed answers with ``1 - confidence <= qhat``: with exchangeable questions, it holds a
correct answer with probability at least ``1 - alpha``. When ``qhat`` is ``+inf`` (the scorer misses too often for
``alpha``), every set is the full proposed list and ``conformal_full_set`` is ``true``: the guarantee then cannot
hold, and the command says so instead of returning sets that look calibrated.

Output: the predictions with ``conformal_set``, ``conformal_qhat`` (``null`` when infinite) and
``conformal_full_set`` added (default ``<predictions>.conformal.jsonl``), and a summary JSON beside it with ``qhat``,
``n_calibration``, the skipped-line counts and, when the test file has gold answers, the empirical coverage (ECR)
and average set size (APSS).

With ``--group-by KEY`` (a per-question value of the rows: ``hops``, a dotted path such as ``extra.type``, the LLM
that answered) every group gets its own ``qhat`` from its own calibration questions (Mondrian conformal), so the
coverage holds within each group; a group whose ``qhat`` is infinite (no calibration question, too few for
``alpha``, or too many of them with no correct proposed answer) gets full sets and is flagged with the reason, and
the summary reports ``qhat``, the calibration size and misses, ECR and APSS per group.

Input problems (bytes that are not UTF-8, invalid JSON, a bad or missing field, a missing ``confidence``, a repeated
``id``, an empty file) stop the command with one ``FILE:LINE: field 'NAME' ...`` line on stderr and exit status 2,
before anything is written; ``--on-bad-record skip`` leaves such lines out instead (logged, and counted in the
summary). The reader is :func:`kglightning.data.predictions.read_predictions`, the one ``evaluate`` uses.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any, Literal

import torch

from kglightning.conformal.functional import conformal_quantile, conformal_rank
from kglightning.conformal.selection_io import group_name, group_value, lookup_key
from kglightning.data.predictions import PredictionLine, PredictionList, read_predictions
from kglightning.data.records import RecordError
from kglightning.fileio import atomic_write, check_outputs_apart, write_text_atomic
from kglightning.metrics.functional.evaluation import AnswerError, confidence_pairs
from kglightning.metrics.functional.qa import prepare_prediction

log = logging.getLogger(__name__)


def scored_answers(rec: PredictionLine, source: str) -> tuple[list[str], list[float], list[bool]]:
    """The question's distinct non-empty answers, their non-conformity ``1 - confidence`` and correctness."""
    if rec.confidence is None:
        raise RecordError(
            "conformal sets need a confidence per answer", source=source, line=rec.line, field="confidence"
        )
    answers = [p for p in prepare_prediction(rec.prediction) if p.strip()]
    try:
        conf, correct = confidence_pairs(rec, answers)
    except AnswerError as e:
        raise RecordError(e.reason, source=source, line=e.line, field=e.field) from None
    return answers, [1.0 - c for c in conf], correct


def calibration_score(rec: PredictionLine, source: str) -> float:
    """Smallest non-conformity of a correct answer; ``+inf`` when none is correct."""
    _, nonconf, correct = scored_answers(rec, source)
    return min((s for s, ok in zip(nonconf, correct) if ok), default=math.inf)


def row_group(rec: PredictionLine, key: str, source: str) -> str:
    """The row's group: the value at ``key`` (dotted for nested objects), a string, number or boolean."""
    try:
        value = lookup_key(rec.row, key)
    except KeyError:
        raise RecordError("missing (named by --group-by)", source=source, line=rec.line, field=key) from None
    if not group_value(value):
        raise RecordError(
            f"expected one string, finite number or boolean per question, got {value!r}",
            source=source, line=rec.line, field=key,
        )  # fmt: skip
    return group_name(value)


def conformalize(
    calibration: str | Path,
    predictions: str | Path,
    alpha: float,
    output: str | Path | None = None,
    on_bad_record: Literal["raise", "skip"] = "raise",
    group_by: str | None = None,
) -> dict[str, Any]:
    """Fit ``qhat`` on ``calibration`` and write the sets of ``predictions`` (see the module docstring).

    Both files are read with :func:`~kglightning.data.predictions.read_predictions` (a confidence per answer
    required) and every test set is computed before the output (and its summary) is written, so bad input leaves
    no file behind.

    Args:
        calibration: predictions jsonl of the calibration questions.
        predictions: predictions jsonl to add sets to.
        alpha: miscoverage level in ``(0, 1)``.
        output: the output jsonl; defaults to ``<predictions>.conformal.jsonl``.
        on_bad_record: ``"raise"`` on the first malformed line, or ``"skip"`` such lines (logged and counted in
            the summary's ``n_calibration_skipped`` / ``n_test_skipped``).
        group_by: a per-question key; each group is calibrated on its own questions (see the module docstring).

    Raises:
        RecordError: a malformed line (naming file, line and field) or an empty file.
        ValueError: ``alpha`` outside ``(0, 1)``, or an output that would replace an input
            (:class:`~kglightning.fileio.OutputOverInputError`).
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    out_path = Path(output) if output else Path(predictions).with_suffix(".conformal.jsonl")
    check_outputs_apart([out_path, out_path.with_suffix(".summary.json"), out_path.with_suffix(".png")],
                        [calibration, predictions])  # fmt: skip
    cal = read_predictions(calibration, on_bad_record=on_bad_record, require_confidence=True)
    # the questions to add sets to may be new ones, without gold answers (ECR and coverage then cover those with)
    test = read_predictions(predictions, on_bad_record=on_bad_record, require_confidence=True, require_gold=False)
    if group_by:
        cal, groups_cal = _grouped(cal, group_by, str(calibration), on_bad_record)
        test, groups_test = _grouped(test, group_by, str(predictions), on_bad_record)
    else:
        groups_cal, groups_test = ["all"] * len(cal), ["all"] * len(test)
    by_group: dict[str, list[float]] = {g: [] for g in dict.fromkeys(groups_cal + groups_test)}
    for r, g in zip(cal, groups_cal):
        by_group[g].append(calibration_score(r, str(calibration)))
    qhats = {g: _qhat(v, alpha) for g, v in by_group.items()}
    stats = {g: {"covered": 0, "sizes": 0, "n_gold": 0, "n_test": 0} for g in by_group}
    rows = []
    for rec, g in zip(test, groups_test):
        qhat = qhats[g]
        answers, nonconf, correct = scored_answers(rec, str(predictions))
        keep = [i for i, s in enumerate(nonconf) if s <= qhat]
        st = stats[g]
        st["sizes"] += len(keep)
        st["n_test"] += 1
        if rec.ground_truth:
            st["n_gold"] += 1
            st["covered"] += any(correct[i] for i in keep)
        rows.append(
            {
                **rec.row,
                "conformal_set": [answers[i] for i in keep],
                "conformal_qhat": None if math.isinf(qhat) else qhat,  # strict JSON has no Infinity
                "conformal_full_set": math.isinf(qhat),
                **({"conformal_group": g} if group_by else {}),
            }
        )
    covered = sum(v["covered"] for v in stats.values())
    n_gold = sum(v["n_gold"] for v in stats.values())
    sizes = sum(v["sizes"] for v in stats.values())
    qhat = math.nan if group_by else qhats["all"]  # grouped: one qhat per group, under "groups"
    scores = torch.tensor([x for v in by_group.values() for x in v], dtype=torch.float64, device="cpu")
    summary = {
        "alpha": alpha,
        "qhat": None if math.isinf(qhat) or math.isnan(qhat) else qhat,  # grouped: per group, under "groups"
        "full_sets": any(math.isinf(q) for q in qhats.values()),
        "n_calibration": len(cal),
        "calibration_missed": int(torch.isinf(scores).sum()),
        "n_test": len(test),
        "ecr": covered / n_gold if n_gold else None,
        "n_gold": n_gold,  # the test questions with gold answers: ECR's denominator
        "apss": sizes / len(test),
        "n_calibration_skipped": len(cal.skipped),
        **({"group_by": group_by, "groups": _group_summary(by_group, qhats, stats, alpha)} if group_by else {}),
        "n_test_skipped": len(test.skipped),
        "output": str(out_path),
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(out_path) as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    summary["plot"] = str(plot_coverage(summary, out_path.with_suffix(".png"))) if summary["ecr"] is not None else None
    write_text_atomic(out_path.with_suffix(".summary.json"), json.dumps(summary, indent=2) + "\n")
    return summary


def plot_coverage(summary: dict[str, Any], path: str | Path) -> Path:
    """The test coverage (ECR) of the sets against the target ``1 - alpha``: one bar for all questions and one per
    group, each labelled with its mean set size (APSS) and test questions; a group whose sets are the full lists
    (no threshold reaches the target) is hatched. ``summary``: what :func:`conformalize` returns."""
    from matplotlib.figure import Figure

    from kglightning.metrics.plots import save_figure

    bars = [("all", summary)] + sorted(summary.get("groups", {}).items())
    bars = [(name, info) for name, info in bars if info.get("ecr") is not None]
    fig = Figure(figsize=(max(4.5, 1.4 * len(bars) + 2), 3.6))
    ax = fig.subplots()
    target = 1 - summary["alpha"]
    for x, (name, info) in enumerate(bars):
        # the pooled bar of grouped sets pools groups of either kind: only a group's (or an ungrouped run's) is hatched
        full = bool(info["full_sets"]) and not (name == "all" and "groups" in summary)
        ax.bar(x, info["ecr"], color="#9fa8da" if full else "#3f51b5", hatch="//" if full else None,
               edgecolor="black", linewidth=0.5)  # fmt: skip
        size = "" if info.get("apss") is None else f"APSS {info['apss']:.2f}\n"
        ax.text(x, max(info["ecr"], target) + 0.03, f"{size}n={info['n_test']}" + ("\nfull sets" if full else ""),
                ha="center", va="bottom", fontsize=7)  # fmt: skip
    ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target 1 - alpha = {target:g}")
    ax.set_xticks(range(len(bars)), [name for name, _ in bars])
    ax.set(ylim=(0, 1.25), ylabel="test coverage (ECR)", title=f"Conformal sets at alpha {summary['alpha']:g}")
    ax.legend(fontsize=7, loc="upper right")
    return save_figure(fig, path)


def _grouped(rows: PredictionList, key: str, source: str, on_bad_record: str) -> tuple[PredictionList, list[str]]:
    """The rows whose group can be read and their groups; a row without one raises, or with ``"skip"`` is left out,
    logged and counted with the other skipped rows."""
    kept, groups = PredictionList(source=rows.source), []
    kept.skipped = list(rows.skipped)
    for rec in rows:
        try:
            groups.append(row_group(rec, key, source))
        except RecordError as e:
            if on_bad_record == "raise":
                raise
            kept.skipped.append(e)
            log.warning("skipping prediction row: %s", e)
            continue
        kept.append(rec)
    if not kept:
        raise RecordError(f"no row has a usable {key!r} (every row skipped)", source=source)
    return kept, groups


def _qhat(scores: list[float], alpha: float) -> float:
    """The group's threshold; ``+inf`` (full sets) for a group with no calibration question."""
    if not scores:
        return math.inf
    return float(conformal_quantile(torch.tensor(scores, dtype=torch.float64, device="cpu"), alpha))


def full_set_reason(n: int, missed: int, alpha: float) -> str:
    """Why a group of ``n`` calibration questions, ``missed`` of them with no correct proposed answer, has an
    infinite ``qhat`` at ``alpha``: ``qhat`` is the ``k``-th smallest score (``k`` of :func:`conformal_rank`), so it
    is infinite when ``k > n`` or when more than ``n - k`` scores are.

    Example:
        >>> full_set_reason(3, 0, 0.2)
        'too few calibration questions for alpha'
        >>> full_set_reason(40, 8, 0.2)  # k = 33: at most 7 of 40 may miss
        'too many calibration questions with no correct proposed answer (8; at most 7 may miss for alpha)'
    """
    if n == 0:
        return "no calibration question"
    k = int(conformal_rank(n, alpha))
    if k > n:
        return "too few calibration questions for alpha"
    return (
        f"too many calibration questions with no correct proposed answer ({missed}; at most {n - k} may miss for alpha)"
    )


def _group_summary(by_group: dict, qhats: dict, stats: dict, alpha: float) -> dict[str, dict[str, Any]]:
    missed = {g: sum(map(math.isinf, scores)) for g, scores in by_group.items()}
    return {
        g: {
            "qhat": None if math.isinf(qhats[g]) else qhats[g],
            "full_sets": math.isinf(qhats[g]),
            "full_set_reason": full_set_reason(len(by_group[g]), missed[g], alpha) if math.isinf(qhats[g]) else None,
            "n_calibration": len(by_group[g]),
            "calibration_missed": missed[g],
            "n_test": st["n_test"],
            "ecr": st["covered"] / st["n_gold"] if st["n_gold"] else None,
            "apss": st["sizes"] / st["n_test"] if st["n_test"] else None,
        }
        for g, st in stats.items()
    }
