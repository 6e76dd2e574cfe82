"""Reliability diagrams, drawn headless with matplotlib's Agg canvas (no pyplot, no display, no global state)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from torch import Tensor

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
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
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
    and the diagonal of perfect calibration; the bottom panel shows how many answers fall in each bin. The title
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
    left = [k * width for k in range(n_bins)]
    nonempty = (bin_count > 0).tolist()
    acc = [a if ne else 0.0 for a, ne in zip(bin_acc.tolist(), nonempty)]
    gap_bottom = [min(a, c) if ne else 0.0 for a, c, ne in zip(bin_acc.tolist(), bin_conf.tolist(), nonempty)]
    gap_height = [abs(a - c) if ne else 0.0 for a, c, ne in zip(bin_acc.tolist(), bin_conf.tolist(), nonempty)]

    fig = Figure(figsize=(5, 6), dpi=100)
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.bar(left, acc, width=width, align="edge", color="tab:blue", edgecolor="black", label="accuracy")
    top.bar(
        left,
        gap_height,
        bottom=gap_bottom,
        width=width,
        align="edge",
        color="tab:red",
        alpha=0.35,
        edgecolor="tab:red",
        hatch="//",
        label="gap to confidence",
    )
    top.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_ylabel("accuracy")
    top.legend(loc="upper left", fontsize="small")
    head = title if title is not None else "Reliability diagram"
    top.set_title(f"{head}\nECE = {ece:.4f}   MCE = {mce:.4f}   (n = {int(bin_count.sum().item())})")
    bottom.bar(left, bin_count.tolist(), width=width, align="edge", color="tab:gray", edgecolor="black")
    bottom.set_xlabel("confidence")
    bottom.set_ylabel("count")
    return save_figure(fig, path)
