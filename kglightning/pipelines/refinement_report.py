"""The report of a KG-Guard refinement run: metrics per refinement step, the iteration distribution, counts.

Everything here reads the per-question rows that :class:`~kglightning.pipelines.refinement.KGGuardRefinement`
writes to ``refinement_predictions.jsonl``, so a report can be rebuilt from that file alone. A row holds its final
``prediction``, its ``ground_truth``, ``iterations`` (the step at which the question was resolved, or
``max_rounds`` when it reached the cap) and ``rounds``: one entry per answer the LLM gave, in order, each with its
``answers``, ``unmatched`` answers, ``abstained``, ``parse_issues``, detector ``scores`` and ``flagged`` names.

Step ``k`` is the state after ``k`` refinement rounds. A question resolved earlier keeps its last answers, so every
step is scored on all questions (KG-Guard §4.4, Fig. 3). Metrics are percentages: the strict set-based F1,
precision, recall and exact match of :func:`~kglightning.metrics.functional.qa.strict_answer_scores` (EM needs
the predicted set to equal the gold set), plus RoG's Hit and F1 for comparison with published tables.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kglightning.fileio import atomic_write, write_text_atomic
from kglightning.metrics.functional.qa import ALL_KEYS, answer_score_sums
from kglightning.metrics.plots import save_figure

__all__ = [
    "TABLE_METRICS",
    "answers_at",
    "format_table",
    "iteration_distribution",
    "plot_refinement",
    "step_counts",
    "step_metrics",
    "summarize",
    "write_report",
]

Row = Mapping[str, Any]

#: metrics of the table and the plot: (header, key of :data:`~kglightning.metrics.functional.qa.ALL_KEYS`)
TABLE_METRICS = (
    ("F1", "strict_f1"),
    ("P", "strict_precision"),
    ("R", "strict_recall"),
    ("EM", "em"),
    ("Hit", "hit"),
    ("RoG-F1", "f1"),
)
_COUNT_COLUMNS = (
    ("prompted", "prompted"),
    ("abstained", "abstained"),
    ("unmatched", "unmatched_answers"),
    ("flagged q", "flagged_examples"),
    ("flagged nodes", "flagged_nodes"),
    ("resolved", "resolved"),
)


REPORT_FILES = (
    "refinement_predictions.jsonl",
    "refinement_rounds.json",
    "refinement_rounds.md",
    "refinement_rounds.png",
)


def answers_at(row: Row, step: int) -> list[str]:
    """The answers of a question after ``step`` refinement rounds (a resolved question keeps its last answers).

    Example:
        >>> row = {"rounds": [{"answers": ["Japan"]}, {"answers": ["Tokyo"]}]}
        >>> answers_at(row, 0), answers_at(row, 1), answers_at(row, 4)
        (['Japan'], ['Tokyo'], ['Tokyo'])
    """
    rounds = row["rounds"]
    return list(rounds[min(step, len(rounds) - 1)]["answers"])


def step_metrics(rows: Sequence[Row], step: int) -> dict[str, float | None]:
    """Mean answer metrics (×100) of every question at ``step``; questions with no gold answer are left out
    (every value is ``None`` when no question has one).

    Example:
        >>> rows = [{"ground_truth": ["Tokyo"], "rounds": [{"answers": ["Japan"]}, {"answers": ["Tokyo"]}]},
        ...         {"ground_truth": ["Paris"], "rounds": [{"answers": ["Paris"]}]}]
        >>> step_metrics(rows, 0)["em"], step_metrics(rows, 1)["em"]
        (50.0, 100.0)
    """
    sums, n, _ = answer_score_sums([answers_at(r, step) for r in rows], [r["ground_truth"] for r in rows])
    return {k: (100.0 * float(v) / n if n else None) for k, v in zip(ALL_KEYS, sums.tolist())}


def step_counts(rows: Sequence[Row], step: int) -> dict[str, Any]:
    """What happened at ``step``, over the questions that got a new answer then (all of them at step 0).

    Keys: ``prompted`` (questions answered at this step), ``abstained``, ``unmatched_answers`` (answers that name no
    KG node), ``scored_nodes`` (answer nodes the detector scored), ``flagged_nodes``, ``flagged_examples``,
    ``resolved`` (questions resolved at this step) and ``parse_issues`` (reason -> count).
    """
    versions = [r["rounds"][step] for r in rows if len(r["rounds"]) > step]
    issues: Counter[str] = Counter()
    for v in versions:
        issues.update(v.get("parse_issues", []))
    return {
        "prompted": len(versions),
        "abstained": sum(bool(v["abstained"]) for v in versions),
        "unmatched_answers": sum(len(v["unmatched"]) for v in versions),
        "scored_nodes": sum(len(v["scores"]) for v in versions),
        "flagged_nodes": sum(len(v["flagged"]) for v in versions),
        "flagged_examples": sum(bool(v["flagged"]) for v in versions),
        "resolved": sum(bool(r["resolved"]) and r["iterations"] == step for r in rows),
        "parse_issues": dict(sorted(issues.items())),
    }


def iteration_distribution(rows: Sequence[Row], max_rounds: int) -> dict[str, int]:
    """Questions per number of refinement iterations: ``"k"`` resolved after ``k`` rounds (``"0"``: the first
    answers raised no flag); ``str(max_rounds)``: reached the cap without being resolved.

    Example:
        >>> iteration_distribution([{"iterations": 0}, {"iterations": 2}, {"iterations": 0}], 2)
        {'0': 2, '1': 0, '2': 1}
    """
    counts = Counter(int(r["iterations"]) for r in rows)
    return {str(k): counts.get(k, 0) for k in range(max_rounds + 1)}


def summarize(
    rows: Sequence[Row], max_rounds: int, meta: Mapping[str, Any] | None = None, timings: Any = None
) -> dict[str, Any]:
    """The JSON report: per-step metrics and counts, the iteration distribution, totals, and ``meta``/``timings``.

    Args:
        rows: per-question rows (see the module docstring).
        max_rounds: the iteration cap of the run.
        meta: run settings to record (detector threshold, reasoner...).
        timings: seconds spent per step, as recorded by the pipeline.
    """
    capped = [r for r in rows if not r["resolved"]]
    scored = sum(1 for r in rows if r["ground_truth"])
    final = [r["rounds"][-1] for r in rows]
    issues: Counter[str] = Counter()
    for r in rows:
        for v in r["rounds"]:
            issues.update(v.get("parse_issues", []))
    return {
        "n_questions": len(rows),
        "n_scored": scored,
        "n_empty_gold": len(rows) - scored,
        "max_rounds": max_rounds,
        "steps": [
            {"step": k, "metrics": step_metrics(rows, k), "counts": step_counts(rows, k)} for k in range(max_rounds + 1)
        ],
        "iterations": iteration_distribution(rows, max_rounds),
        "totals": {
            "llm_calls": sum(len(r["rounds"]) for r in rows),
            "abstentions": sum(bool(v["abstained"]) for r in rows for v in r["rounds"]),
            "final_abstentions": sum(bool(v["abstained"]) for v in final),
            "unmatched_answers": sum(len(v["unmatched"]) for r in rows for v in r["rounds"]),
            "final_unmatched_answers": sum(len(v["unmatched"]) for v in final),
            "capped": len(capped),
            "capped_still_flagged": sum(bool(r["rounds"][-1]["flagged"]) for r in capped),
            "parse_issues": dict(sorted(issues.items())),
        },
        "meta": dict(meta or {}),
        "timings": timings,
    }


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def format_table(summary: Mapping[str, Any]) -> str:
    """A markdown table of the steps of :func:`summarize`, then the iteration distribution.

    Example:
        >>> rows = [{"ground_truth": ["Tokyo"], "resolved": True, "iterations": 1, "rounds": [
        ...     {"answers": ["Japan"], "unmatched": [], "abstained": False, "scores": {"Japan": 0.9},
        ...      "flagged": ["Japan"]},
        ...     {"answers": ["Tokyo"], "unmatched": [], "abstained": False, "scores": {"Tokyo": 0.1}, "flagged": []}]}]
        >>> print(format_table(summarize(rows, 1)).splitlines()[2])
        | 0 | 1 | 0 | 0 | 1 | 1 | 0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 | 0.0 |
    """
    heads = ["step", *(h for h, _ in _COUNT_COLUMNS), *(h for h, _ in TABLE_METRICS)]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for s in summary["steps"]:
        cells = [str(s["step"]), *(str(s["counts"][k]) for _, k in _COUNT_COLUMNS)]
        cells += [_fmt(s["metrics"][k]) for _, k in TABLE_METRICS]
        lines.append("| " + " | ".join(cells) + " |")
    cap = summary["max_rounds"]
    dist = ", ".join(f"{k}{' (cap)' if int(k) == cap else ''}: {v}" for k, v in summary["iterations"].items())
    totals = summary["totals"]
    lines += [
        "",
        f"Iterations per question ({summary['n_questions']} questions): {dist}",
        f"Capped: {totals['capped']} ({totals['capped_still_flagged']} still flagged after the last round); "
        f"abstentions: {totals['abstentions']} of {totals['llm_calls']} answers; "
        f"unmatched answers: {totals['unmatched_answers']}",
    ]
    if summary.get("timings"):
        spent = {}
        for entry in summary["timings"].values():
            for key, seconds in entry.items():
                spent[key] = spent.get(key, 0.0) + seconds
        lines.append("Seconds: " + ", ".join(f"{k.removesuffix('_s')} {v:.1f}" for k, v in sorted(spent.items())))
    return "\n".join(lines) + "\n"


def plot_refinement(summary: Mapping[str, Any], path: str | Path) -> Path:
    """Write a PNG with two panels: metrics per refinement step, and the iteration histogram (cap bar in red).

    Args:
        summary: the output of :func:`summarize`.
        path: the PNG to write (parent folders are created).

    Returns:
        The path written.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    steps = [s["step"] for s in summary["steps"]]
    fig = Figure(figsize=(10, 4), dpi=100)
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    for label, key in TABLE_METRICS:
        style = "--" if key in ("hit", "f1") else "-"
        values = [s["metrics"][key] for s in summary["steps"]]
        left.plot(steps, [float("nan") if v is None else v for v in values], style, marker="o", label=label)
    left.set_xticks(steps)
    left.set_xlabel("refinement step")
    left.set_ylabel("score (%)")
    left.set_title(f"KBQA metrics per step (n = {summary['n_scored']})")
    left.legend(loc="best", fontsize="small")
    left.grid(alpha=0.3)

    cap = summary["max_rounds"]
    keys = list(summary["iterations"])
    counts = [summary["iterations"][k] for k in keys]
    colors = ["tab:red" if int(k) == cap else "tab:blue" for k in keys]
    bars = right.bar([int(k) for k in keys], counts, color=colors, edgecolor="black")
    right.bar_label(bars)
    right.yaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_xticks([int(k) for k in keys], [f"{k}\n(cap)" if int(k) == cap else k for k in keys])
    right.set_xlabel("refinement iterations")
    right.set_ylabel("questions")
    right.set_title("Iterations per question")
    return save_figure(fig, path)


def write_report(
    rows: Sequence[Row],
    output_dir: str | Path,
    max_rounds: int,
    meta: Mapping[str, Any] | None = None,
    timings: Any = None,
) -> dict[str, Any]:
    """Write ``refinement_predictions.jsonl``, ``refinement_rounds.json``, ``refinement_rounds.md`` and
    ``refinement_rounds.png`` to ``output_dir``; return the summary (see :func:`summarize`).
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_write(out / "refinement_predictions.jsonl") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    summary = summarize(rows, max_rounds, meta, timings)
    write_text_atomic(out / "refinement_rounds.json", json.dumps(summary, indent=2, ensure_ascii=False))
    write_text_atomic(out / "refinement_rounds.md", format_table(summary))
    plot_refinement(summary, out / "refinement_rounds.png")
    return summary
