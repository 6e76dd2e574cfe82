"""Files and tables of a pipeline run that compares answer variants on the same questions.

:func:`write_comparison` takes per-question rows that hold one prediction per variant, writes each variant's
predictions in the format of :mod:`kglightning.evaluate`, scores them as that command does
(:func:`~kglightning.metrics.evaluation.write_evaluation`: RoG's Hit/Recall/F1, strict F1/EM, ECE/MCE/Brier, a
reliability diagram per variant), and writes one comparison table (markdown and JSON) and one overlaid reliability
plot.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kglightning.data.predictions import read_predictions
from kglightning.fileio import atomic_write, write_text_atomic
from kglightning.metrics.evaluation import format_result, write_evaluation
from kglightning.metrics.functional.calibration import expected_calibration_error, reliability_bins
from kglightning.metrics.plots import save_figure

__all__ = ["TABLE_COLUMNS", "comparison_markdown", "plot_reliability_comparison", "write_comparison"]

TABLE_COLUMNS = (
    ("Hit", "hit"),
    ("Recall", "recall"),
    ("F1", "f1"),
    ("EM", "em"),
    ("ECE ↓", "ece"),
    ("Brier ↓", "brier"),
    ("Abstained", "abstained"),
    ("Input tokens / q", "input_tokens"),
)
"""Columns of the comparison table: (header, key of the result dict)."""


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def comparison_markdown(results: Mapping[str, Mapping[str, Any]], labels: Mapping[str, str] | None = None) -> str:
    """A markdown table with one row per variant (metrics ×100, as :mod:`kglightning.evaluate` reports them).

    Example:
        >>> print(comparison_markdown({"doublycal": {"hit": 50.0, "n_questions": 2}}))
        | Variant | Hit | Recall | F1 | EM | ECE ↓ | Brier ↓ | Abstained | Input tokens / q |
        |---|---|---|---|---|---|---|---|---|
        | doublycal | 50.0 | – | – | – | – | – | – | – |
    """
    labels = labels or {}
    head = "| Variant | " + " | ".join(h for h, _ in TABLE_COLUMNS) + " |"
    rule = "|---" * (len(TABLE_COLUMNS) + 1) + "|"
    rows = [
        f"| {labels.get(name, name)} | " + " | ".join(_fmt(r.get(k)) for _, k in TABLE_COLUMNS) + " |"
        for name, r in results.items()
    ]
    return "\n".join([head, rule, *rows])


def plot_reliability_comparison(
    pairs: Mapping[str, tuple[Sequence[float], Sequence[bool]]], path: str | Path, n_bins: int = 10
) -> Path:
    """One reliability plot with a curve per variant (bin accuracy against bin confidence, ECE in the legend).

    Args:
        pairs: variant -> (confidences, correctness) of its answers; variants without answers are left out.
        path: the PNG to write.
        n_bins: equal-width confidence bins.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", label="perfect calibration")
    for name, (conf, correct) in pairs.items():
        if not conf:
            continue
        bin_conf, bin_acc, count = reliability_bins(conf, correct, n_bins)
        keep = (count > 0).tolist()
        xs = [c for c, k in zip(bin_conf.tolist(), keep) if k]
        ys = [a for a, k in zip(bin_acc.tolist(), keep) if k]
        ece = expected_calibration_error(conf, correct, n_bins=n_bins).item() * 100
        ax.plot(xs, ys, marker="o", label=f"{name} (ECE {ece:.1f}, n={len(conf)})")
    ax.set_xlim(0, 1.02)  # a point at 1.0: the bin of confidence exactly 1.0
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.set_title("Reliability by variant")
    ax.legend(loc="upper left", fontsize="small")
    return save_figure(fig, path)


def _prediction_line(row: Mapping[str, Any], out: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "question": row["question"],
        "prediction": list(out["prediction"]),
        "ground_truth": list(row["answer"]),
        "confidence": list(out["confidence"]),
    }


EVALUATION_FILES = ("predictions.jsonl", "detailed_eval_result.jsonl", "reliability.png", "eval_result.txt")
COMPARISON_FILES = ("comparison.md", "comparison.json", "reliability_comparison.png")


def comparison_outputs(output_dir: str | Path, variants: Sequence[str]) -> list[Path]:
    """Every file :func:`write_comparison` writes (a run removes them when it starts, so none is stale)."""
    out = Path(output_dir)
    return [out / n for n in COMPARISON_FILES] + [out / v / n for v in variants for n in EVALUATION_FILES]


def write_comparison(
    rows: Sequence[Mapping[str, Any]],
    variants: Sequence[str],
    output_dir: str | Path,
    n_bins: int = 10,
    quiet: bool = True,
) -> dict[str, dict[str, Any]]:
    """Write and score every variant's predictions, then the comparison table and plot.

    Args:
        rows: per question ``id``, ``question``, ``answer`` (gold) and ``variants``: variant ->
            ``{"prediction": [...], "confidence": [...], "input_tokens": int}``.
        variants: the variants to report, in table order.
        output_dir: gets ``<variant>/predictions.jsonl`` with its evaluation files, ``comparison.md``,
            ``comparison.json`` and ``reliability_comparison.png``.
        n_bins: calibration bins.
        quiet: do not print each variant's ``eval_result.txt``.

    Returns:
        variant -> the :func:`~kglightning.metrics.evaluation.write_evaluation` results plus ``abstained`` (questions
        without any answer) and ``input_tokens`` (mean reasoner input tokens per question).
    """
    out_dir = Path(output_dir)
    results: dict[str, dict[str, Any]] = {}
    pairs: dict[str, tuple[list[float], list[bool]]] = {}
    for name in variants:
        folder = out_dir / name
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "predictions.jsonl"
        outs = [(row, row["variants"][name]) for row in rows]
        with atomic_write(path) as f:
            for row, out in outs:
                f.write(json.dumps(_prediction_line(row, out), ensure_ascii=False) + "\n")
        scored: dict[str, Any] = {}
        res: dict[str, Any] = dict(
            write_evaluation(read_predictions(path), folder, n_bins=n_bins, title=path.name, out=scored)
        )
        if not quiet:
            print(format_result(res), end="")
        res["n_skipped"] = 0
        res["abstained"] = sum(not out["prediction"] for _, out in outs)
        res["input_tokens"] = sum(out.get("input_tokens", 0) for _, out in outs) / max(len(outs), 1)
        results[name] = res
        pairs[name] = scored["pairs"]  # the pairs behind res["ece"]
    table = comparison_markdown(results)
    write_text_atomic(out_dir / "comparison.md", table + "\n")
    write_text_atomic(out_dir / "comparison.json", json.dumps(results, indent=2) + "\n")
    plot_reliability_comparison(pairs, out_dir / "reliability_comparison.png", n_bins)
    return results
