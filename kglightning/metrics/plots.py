"""Reliability diagrams, drawn headless with matplotlib's Agg canvas (no pyplot, no display, no global state)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from torch import Tensor

from kglightning.fileio import atomic_write
from kglightning.metrics.functional.calibration import (
    expected_calibration_error,
    maximum_calibration_error,
    reliability_bins,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Lay out ``fig`` tightly and write it as a PNG to ``path`` (parent folders are created); return the path."""
    fig.tight_layout()
    out = Path(path)
    with atomic_write(out, "wb") as f:
        fig.savefig(f, format="png")
    return out


def plot_reliability_diagram(
    conf: Tensor | Sequence[float],
    correct: Tensor | Sequence[bool],
    path: str | Path,
    n_bins: int = 10,
    title: str | None = None,
) -> Path:
    """Write a reliability diagram PNG: accuracy per confidence bin against the diagonal, over a confidence histogram.

    The top panel shows one bar per bin at its accuracy, a red "gap" bar up or down to the bin's mean confidence,
    and the diagonal of perfect calibration; answers with confidence exactly 1.0 have their own narrow bar right of
    1, as they have their own bin in the ECE; the bottom panel shows how many answers fall in each bin. The title
    carries ECE and MCE (see :func:`~kglightning.metrics.functional.calibration.expected_calibration_error`).

    Args:
        conf: ``(N,)`` confidences in ``[0, 1]``.
        correct: ``(N,)`` whether each answer is right.
        path: the PNG to write (parent folders are created).
        n_bins: number of equal-width bins.
        title: text before the ECE line; defaults to ``"Reliability diagram"``.

    Returns:
        The path written.

    Example:
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "r.png")
        >>> out = plot_reliability_diagram([0.9, 0.8, 0.3, 0.6], [1, 0, 0, 1], path)
        >>> out.read_bytes()[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
        True
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    bin_conf, bin_acc, bin_count = reliability_bins(conf, correct, n_bins)
    ece = expected_calibration_error(conf, correct, n_bins=n_bins).item()
    mce = maximum_calibration_error(conf, correct, n_bins=n_bins).item()
    width = 1.0 / n_bins
    # the n_bins bins, then the slot of confidence exactly 1.0 (its own bin in the ECE) as a narrow bar right of 1
    edge = width / 2
    left = [k * width for k in range(n_bins)] + [1.0]
    widths = [width] * n_bins + [edge]
    nonempty = (bin_count > 0).tolist()
    acc = [a if ne else 0.0 for a, ne in zip(bin_acc.tolist(), nonempty)]
    gap_bottom = [min(a, c) if ne else 0.0 for a, c, ne in zip(bin_acc.tolist(), bin_conf.tolist(), nonempty)]
    gap_height = [abs(a - c) if ne else 0.0 for a, c, ne in zip(bin_acc.tolist(), bin_conf.tolist(), nonempty)]

    fig = Figure(figsize=(5, 6), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.bar(left, acc, width=widths, align="edge", color="tab:blue", edgecolor="black", label="accuracy")
    top.bar(
        left,
        gap_height,
        bottom=gap_bottom,
        width=widths,
        align="edge",
        color="tab:red",
        alpha=0.35,
        edgecolor="tab:red",
        hatch="//",
        label="gap to confidence",
    )
    top.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    top.set_xlim(0, 1 + edge)
    top.axvline(1.0, color="black", linewidth=0.8)
    top.set_ylim(0, 1)
    top.set_ylabel("accuracy")
    top.legend(loc="upper left", fontsize="small")
    head = title if title is not None else "Reliability diagram"
    top.set_title(f"{head}\nECE = {ece:.4f}   MCE = {mce:.4f}   (n = {int(bin_count.sum().item())})")
    bottom.bar(left, bin_count.tolist(), width=widths, align="edge", color="tab:gray", edgecolor="black")
    bottom.set_xlabel("confidence (the bar right of 1: confidence exactly 1.0)")
    bottom.set_ylabel("count")
    return save_figure(fig, path)


def plot_seed_summary(
    summary: dict[str, dict[str, float]],
    path: str | Path,
    metrics: Sequence[str] = ("f1", "auc_pr"),
    title: str | None = None,
    over: str = "seeds",
) -> Path | None:
    """Write a grouped bar chart of test metrics over seeds: one group per method, mean with a ±1 std error bar.

    ``summary`` maps metric names to ``{"mean", "std"}``, as ``python -m kglightning seeds`` writes them:
    ``test/<metric>`` is the trained model, ``test/<method>/<metric>`` a baseline scored beside it, and
    ``test/all/...`` the same over every answer (a bar of its own per metric, beside the graph nodes'). Methods without
    any of ``metrics`` are left out; when no method has one, nothing is written and ``None`` is returned. ``over``
    names what the standard deviation is over in the labels (``"seeds"``, or ``"folds"`` for cross-validation).

    Example:
        >>> import tempfile, os
        >>> s = {"test/f1": {"mean": 0.9, "std": 0.01}, "test/random/f1": {"mean": 0.6, "std": 0.0}}
        >>> out = plot_seed_summary(s, os.path.join(tempfile.mkdtemp(), "s.png"))
        >>> out.read_bytes()[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
        True
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # test/<metric> and test/<method>/<metric> over the graph nodes; test/all/... over every answer
    methods: dict[str, dict[tuple[str, str], dict[str, float]]] = {}
    for key, value in summary.items():
        parts = key.split("/")
        if parts[0] != "test" or len(parts) < 2:
            continue
        population, rest = ("every answer", parts[2:]) if parts[1] == "all" else ("nodes", parts[1:])
        if not rest or rest[-1] not in metrics or len(rest) > 2:
            continue
        methods.setdefault("model" if len(rest) == 1 else rest[0], {})[(population, rest[-1])] = value
    if not methods:
        return None
    names = ["model", *sorted(m for m in methods if m != "model")] if "model" in methods else sorted(methods)
    present = {series for m in methods.values() for series in m}
    populations = [p for p in ("every answer", "nodes") if any(q == p for q, _ in present)]
    series = [(p, m) for p in populations for m in metrics if (p, m) in present]
    width = 0.8 / len(series)
    fig = Figure(figsize=(max(5.0, 1.1 * len(names) * max(1, len(series) / 2) + 1), 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for k, key in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(names))]
        means = [methods[n].get(key, {}).get("mean", float("nan")) for n in names]
        stds = [methods[n].get(key, {}).get("std", 0.0) for n in names]
        label = key[1] if len(populations) == 1 else f"{key[1]} ({key[0]})"
        ax.bar(xs, means, width=width, yerr=stds, capsize=3, label=label, edgecolor="black")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
    ax.set_ylim(0, 1.12)  # room for the legend above the bars
    ax.set_ylabel(f"test score (mean ± std over {over})")
    ax.legend(loc="upper center", ncol=len(series), fontsize="small", frameon=False)
    ax.set_title(title or f"Test metrics over {over}")
    ax.grid(axis="y", alpha=0.3)
    return save_figure(fig, path)
