"""Summaries and markdown tables of test metrics over repeated runs: seeds, or folds of a cross-validation by seeds.

``python -m kglightning seeds`` fits a config once per (fold, seed) and keeps every run's test metrics. These pure
functions turn them into what it prints and writes: the mean and spread of every metric (:func:`summarize_seeds`,
:func:`summarize_folds`, :func:`summary_table`), a table of every scorer side by side with the detector's paired
difference to each baseline (:func:`compare_scorers`, :func:`comparison_table`) and one progress line per run
(:func:`progress_line`).

Runs are given as ``{group: {run: {metric: value}}}``: the groups are the folds (each holding its seeds' runs), or,
without folds, one group per seed. A metric counts only when every run has it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "COLUMNS",
    "compare_scorers",
    "comparison_table",
    "progress_line",
    "scorer_of",
    "summarize_folds",
    "summarize_seeds",
    "summary_table",
]

Runs = Mapping[str, Mapping[str, Mapping[str, float]]]

#: the comparison table's columns: over every answer (``all/``), then over the answers grounded in the graph
COLUMNS = ("all/f1", "all/auc_pr", "all/auroc", "f1", "auc_pr")
#: the scorers' order in the comparison table (others follow by name)
_KNOWN = ("detector", "structural", "mostfrequent", "random")
#: the metrics a progress line shows when the run has them
_PROGRESS = ("test/all/f1", "test/all/auc_pr", "test/f1", "test/auc_pr")


def _std(values: Sequence[float]) -> float:
    """The sample standard deviation; NaN when a value is NaN (a diverged run), rather than an error."""
    if any(math.isnan(v) for v in values):
        return math.nan
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _common(runs: Iterable[Mapping[str, float]]) -> list[str]:
    sets = [set(m) for m in runs]
    return sorted(set.intersection(*sets)) if sets else []


def summarize_seeds(runs: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """``{metric: {"mean", "std"}}`` over the runs ``{seed: {metric: value}}`` (sample standard deviation).

    Example:
        >>> s = summarize_seeds({"0": {"test/f1": 0.5}, "1": {"test/f1": 0.7, "test/loss": 1.0}})
        >>> list(s), round(s["test/f1"]["mean"], 4), round(s["test/f1"]["std"], 4)
        (['test/f1'], 0.6, 0.1414)
    """
    out = {}
    for name in _common(runs.values()):
        values = [m[name] for m in runs.values()]
        out[name] = {"mean": statistics.fmean(values), "std": _std(values)}
    return out


def summarize_folds(runs: Runs) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """The summary and the per-fold means of runs ``{fold: {seed: {metric: value}}}``.

    Returns:
        ``(summary, fold_means)``: ``summary[metric]`` holds ``mean`` and ``std`` of the fold means (the spread
        across folds), ``std_runs`` over every run, ``std_seeds`` the mean over folds of the spread across seeds
        within a fold, and ``runs``, their number; ``fold_means[metric][fold]`` is the fold's mean over its seeds.

    Example:
        >>> runs = {"0": {"0": {"f1": 0.5}, "1": {"f1": 0.7}}, "1": {"0": {"f1": 0.8}, "1": {"f1": 0.8}}}
        >>> summary, means = summarize_folds(runs)
        >>> round(summary["f1"]["mean"], 3), round(summary["f1"]["std"], 3), means["f1"]
        (0.7, 0.141, {'0': 0.6, '1': 0.8})
    """
    names = _common(m for group in runs.values() for m in group.values())
    summary: dict[str, dict[str, float]] = {}
    fold_means: dict[str, dict[str, float]] = {}
    for name in names:
        per_fold = {fold: [m[name] for m in group.values()] for fold, group in runs.items() if group}
        means = {fold: statistics.fmean(v) for fold, v in per_fold.items()}
        every = [x for v in per_fold.values() for x in v]
        summary[name] = {
            "mean": statistics.fmean(means.values()),
            "std": _std(list(means.values())),
            "std_runs": _std(every),
            "std_seeds": statistics.fmean(_std(v) for v in per_fold.values()),
            "runs": len(every),
        }
        fold_means[name] = means
    return summary, fold_means


def summary_table(
    summary: Mapping[str, Mapping[str, float]],
    fold_means: Mapping[str, Mapping[str, float]] | None = None,
    label: str = "",
) -> str:
    """One markdown table of a summary: mean and std per metric, and with ``fold_means`` the spread across folds,
    over runs and across seeds, then each fold's mean.

    Example:
        >>> print(summary_table({"test/f1": {"mean": 0.61, "std": 0.02}}, label="seeds 0, 1"))
        | metric | mean | std (over seeds 0, 1) |
        |---|---:|---:|
        | test/f1 | 0.6100 | 0.0200 |
    """
    if fold_means is None:
        lines = [f"| metric | mean | std (over {label or 'seeds'}) |", "|---|---:|---:|"]
        lines += [f"| {k} | {r['mean']:.4f} | {r['std']:.4f} |" for k, r in summary.items()]
        return "\n".join(lines)
    folds = sorted({f for means in fold_means.values() for f in means}, key=_natural)
    head = f"| metric | mean ± std over folds{f' ({label})' if label else ''} | std over runs | std over seeds | "
    head += " | ".join(f"fold {f}" for f in folds) + " |"
    lines = [head, "|---|---:|---:|---:|" + "---:|" * len(folds)]
    for k, r in summary.items():
        cells = " | ".join(f"{fold_means[k][f]:.4f}" if f in fold_means.get(k, {}) else "" for f in folds)
        lines.append(f"| {k} | {r['mean']:.4f} ± {r['std']:.4f} | {r['std_runs']:.4f} | {r['std_seeds']:.4f} | "
                     f"{cells} |")  # fmt: skip
    return "\n".join(lines)


def _natural(key: str) -> tuple[int, str]:
    return (int(key), "") if key.lstrip("-").isdigit() else (1 << 30, key)


def scorer_of(metric: str) -> tuple[str, str] | None:
    """``(scorer, column)`` of a test metric name, or ``None`` for a name outside :data:`COLUMNS`.

    ``test/<metric>`` and ``test/all/<metric>`` are the detector's; ``test/<scorer>/<metric>`` and
    ``test/all/<scorer>/<metric>`` a baseline's, scored beside it.

    Example:
        >>> scorer_of("test/all/f1"), scorer_of("test/structural/auc_pr"), scorer_of("test/loss")
        (('detector', 'all/f1'), ('structural', 'auc_pr'), None)
    """
    parts = metric.split("/")
    if parts[0] != "test":
        return None
    every = len(parts) > 2 and parts[1] == "all"
    rest = parts[2:] if every else parts[1:]
    if len(rest) not in (1, 2):
        return None
    scorer, name = ("detector", rest[0]) if len(rest) == 1 else (rest[0], rest[1])
    column = f"all/{name}" if every else name
    return (scorer, column) if column in COLUMNS else None


def compare_scorers(runs: Runs, unit: str = "folds") -> dict[str, object]:
    """Every scorer's test scores side by side, and the detector's paired difference to each baseline.

    Args:
        runs: ``{group: {run: {metric: value}}}`` (groups are folds, or one seed each).
        unit: what a group is, for the sign counts (``"folds"`` or ``"seeds"``).

    Returns:
        ``{"unit", "groups", "scores", "differences"}``: ``scores[scorer][column]`` is ``{"mean", "std", "runs"}``,
        the mean and the sample standard deviation of the groups' means (the spread across folds, as the summary's
        headline) and the number of runs; ``differences[baseline][column]`` is ``{"mean", "positive"}``: the mean of the
        detector's score minus the baseline's (same run), averaged within each group then over the groups (as the
        scores), and in how many groups that difference's mean is above zero.

    Example:
        >>> runs = {"0": {"0": {"test/f1": 0.9, "test/random/f1": 0.5}}, "1": {"0": {"test/f1": 0.6,
        ...         "test/random/f1": 0.7}}}
        >>> c = compare_scorers(runs)
        >>> c["scores"]["detector"]["f1"]["mean"], c["differences"]["random"]["f1"]
        (0.75, {'mean': 0.15000000000000002, 'positive': 1})
    """
    flat = [m for group in runs.values() for m in group.values()]
    found: dict[str, dict[str, str]] = {}
    for name in _common(flat):
        parsed = scorer_of(name)
        if parsed is not None:
            found.setdefault(parsed[0], {})[parsed[1]] = name
    order = [s for s in _KNOWN if s in found] + sorted(s for s in found if s not in _KNOWN)
    filled = [group for group in runs.values() if group]

    def spread(name: str) -> dict[str, float]:
        # as the summary's headline: the mean and the sample std of the groups' means (the spread across folds)
        means = [statistics.fmean(m[name] for m in group.values()) for group in filled]
        return {"mean": statistics.fmean(means), "std": _std(means), "runs": sum(len(g) for g in filled)}

    scores = {
        scorer: {column: spread(found[scorer][column]) for column in COLUMNS if column in found[scorer]}
        for scorer in order
    }
    differences: dict[str, dict[str, dict[str, float]]] = {}
    mine = found.get("detector", {})
    for scorer in order:
        if scorer == "detector":
            continue
        for column in COLUMNS:
            if column not in mine or column not in found[scorer]:
                continue
            a, b = mine[column], found[scorer][column]
            per_group = [[m[a] - m[b] for m in group.values()] for group in runs.values() if group]
            differences.setdefault(scorer, {})[column] = {
                "mean": statistics.fmean(statistics.fmean(g) for g in per_group),  # as the scores: of group means
                "positive": sum(statistics.fmean(g) > 0 for g in per_group),
            }
    groups = sum(1 for group in runs.values() if group)
    return {"unit": unit, "groups": groups, "scores": scores, "differences": differences}


def comparison_table(comparison: Mapping[str, object]) -> str:
    """A markdown table of :func:`compare_scorers`: one row per scorer (mean ± std of the groups' means per column),
    then one row per baseline with the detector's mean difference and in how many groups it is positive.

    Example:
        >>> runs = {"0": {"0": {"test/f1": 0.9, "test/random/f1": 0.5}}, "1": {"0": {"test/f1": 0.6,
        ...         "test/random/f1": 0.7}}}
        >>> print(comparison_table(compare_scorers(runs)))
        | scorer | f1 |
        |---|---:|
        | detector | 0.750 ± 0.212 |
        | random | 0.600 ± 0.141 |
        | detector - random | +0.150 (1/2 folds) |
    """
    scores: Mapping[str, Mapping[str, Mapping[str, float]]] = comparison["scores"]  # type: ignore[assignment]
    differences: Mapping[str, Mapping[str, Mapping[str, float]]] = comparison["differences"]  # type: ignore[assignment]
    columns = [c for c in COLUMNS if any(c in row for row in scores.values())]
    if not columns:
        return "(no test metric of a scorer in the comparison columns: " + ", ".join(COLUMNS) + ")"
    lines = ["| scorer | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for scorer, row in scores.items():
        cells = [f"{row[c]['mean']:.3f} ± {row[c]['std']:.3f}" if c in row else "" for c in columns]
        lines.append(f"| {scorer} | " + " | ".join(cells) + " |")
    unit, groups = comparison["unit"], comparison["groups"]
    for baseline, row in differences.items():
        cells = [f"{row[c]['mean']:+.3f} ({row[c]['positive']}/{groups} {unit})" if c in row else "" for c in columns]
        lines.append(f"| detector - {baseline} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def progress_line(label: str, metrics: Mapping[str, float]) -> str:
    """One line for a finished run: ``label``, then its headline test metrics (:data:`_PROGRESS`, or the first four
    test metrics by name when it has none of them) and the validation score its checkpoint was chosen by.

    Example:
        >>> progress_line("fold 2/5, seed 0", {"test/all/f1": 0.61, "test/loss": 0.3, "best/val/auc_pr": 0.7})
        'fold 2/5, seed 0: test/all/f1 0.6100, best/val/auc_pr 0.7000'
    """
    shown = [k for k in _PROGRESS if k in metrics] or sorted(k for k in metrics if k.startswith("test/"))[:4]
    shown += sorted(k for k in metrics if k.startswith("best/"))
    return f"{label}: " + ", ".join(f"{k} {metrics[k]:.4f}" for k in shown)
