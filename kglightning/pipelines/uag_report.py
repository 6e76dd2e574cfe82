"""UAG's reports: the console summary of a Learn-Then-Test selection, how often the evaluator is kept, the ECR/APSS
table over alpha (UAG beside Top-K and split CP on retrieval distance, and with a sampler Top-K and split CP on the
LLM's scores, CLM and LoFreeCP) and the coverage-vs-alpha plot.

Rows are the per-question outputs of :class:`~kglightning.pipelines.uag.UAGReasoner`: each carries, for every swept
``alpha`` and every method, ``[covered, set size]``. A method that abstains at some ``alpha`` (no certified
configuration, an infinite split-CP threshold, or no ``K`` reaching the coverage) is shown as ``abstain`` in the
table, as the paper's ``-``, and as an empty marker in the plot; its full-pool numbers stay in the JSON.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kglightning.conformal.uag import UAGCalibration
from kglightning.conformal.uag.controller import COMPONENTS
from kglightning.fileio import write_text_atomic
from kglightning.metrics.plots import save_figure  # noqa: E402

METHODS = ("uag", "split_cp", "top_k", "split_cp_llm", "top_k_llm", "clm", "lofree_cp")
LABELS = {"uag": "UAG", "split_cp": "Split CP", "top_k": "Top-K", "split_cp_llm": "Split CP (LLM)",
          "top_k_llm": "Top-K (LLM)", "clm": "CLM", "lofree_cp": "LoFreeCP"}  # fmt: skip


SWEEP_FILES = ("sweep.json", "sweep.md", "coverage_vs_alpha.png")


def describe(cal: UAGCalibration) -> str:
    """One paragraph on an LTT selection, for the console."""
    head = f"UAG at alpha={cal.alpha:g} (delta={cal.delta:g}; {int(cal.valid.sum())} of {cal.valid.numel()} valid)"
    if cal.abstained:
        return f"{head}: no configuration certified, so UAG abstains (full candidate pools, flagged)"
    parts = [
        f"{c} alpha={a:g} (threshold {q:.4f})"
        for c, a, q in zip(COMPONENTS, cal.selected_alphas or (), cal.selected_thresholds)
    ]
    s = cal.summary()
    return (
        f"{head}: LTT selected " + ", ".join(parts) + f"; calibration error rate {s['calibration_error_rate']:.3f} "
        f"(p={s['pvalue']:.2g}, n={cal.n_cal}), selection mean set size {s['selection_mean_set_size']:.1f}"
    )


def evaluator_usage(selections: dict[float, UAGCalibration]) -> dict[str, Any]:
    """How often Learn-Then-Test keeps the candidate evaluator (Eq. 6) over the swept levels.

    ``alpha3_positive``: certified levels whose selected ``alpha3 > 0``; ``filtering``: those whose evaluator
    threshold is also finite, i.e. the evaluator removes candidates (``alpha3 > 0`` with a calibration split too small
    for it gives ``+inf``, the component off in effect); ``selected_alpha3``: per level, ``None`` when abstaining.
    """
    chosen = {alpha_key(a): c.selected_alphas for a, c in sorted(selections.items())}
    q3 = {alpha_key(a): c.selected_thresholds[2] for a, c in sorted(selections.items()) if not c.abstained}
    return {
        "levels": len(chosen),
        "certified": sum(v is not None for v in chosen.values()),
        "alpha3_positive": sum(v is not None and v[2] > 0 for v in chosen.values()),
        "filtering": sum(v is not None and v[2] > 0 and math.isfinite(q3[k]) for k, v in chosen.items()),
        "selected_alpha3": {k: None if v is None else v[2] for k, v in chosen.items()},
    }


def alpha_key(alpha: float) -> str:
    """The string key of an alpha level (``0.2`` -> ``"0.2"``)."""
    return f"{alpha:g}"


def sweep_results(
    rows: Sequence[dict[str, Any]], alphas: Sequence[float], abstained: dict[str, dict[str, bool]]
) -> list[dict[str, Any]]:
    """Per alpha and method: ``ecr``, ``apss``, ``abstained`` over the rows (the test questions)."""
    out = []
    n = max(len(rows), 1)
    for alpha in alphas:
        key = alpha_key(alpha)
        entry: dict[str, Any] = {"alpha": alpha, "n": len(rows)}
        for m in (m for m in METHODS if m in abstained[key]):
            pairs = [row["sweep"][key][m] for row in rows]
            entry[m] = {
                "ecr": sum(bool(c) for c, _ in pairs) / n,
                "apss": sum(int(s) for _, s in pairs) / n,
                "abstained": bool(abstained[key][m]),
            }
        out.append(entry)
    return out


def _methods(results: Sequence[dict[str, Any]]) -> list[str]:
    return [m for m in METHODS if results and m in results[0]]


def _cell(res: dict[str, Any]) -> tuple[str, str]:
    if res["abstained"]:
        return "abstain", "-"
    return f"{100 * res['ecr']:.1f}", f"{res['apss']:.1f}"


def sweep_markdown(results: Sequence[dict[str, Any]]) -> str:
    """The ECR (%) / APSS table, one row per alpha."""
    methods = _methods(results)
    head = "| α | target ECR | " + " | ".join(f"{LABELS[m]} ECR | {LABELS[m]} APSS" for m in methods) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(methods))]
    for r in results:
        cells = [c for m in methods for c in _cell(r[m])]
        lines.append(f"| {r['alpha']:g} | ≥ {100 * (1 - r['alpha']):.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_sweep(results: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """Coverage and set size against alpha for every method; abstentions drawn as hollow markers at the pool."""
    fig, (ax_c, ax_s) = plt.subplots(1, 2, figsize=(10, 4))
    alphas = [r["alpha"] for r in results]
    ax_c.plot(alphas, [1 - a for a in alphas], "k--", lw=1, label="1 − α (target)")
    for m, marker in zip(_methods(results), "osD^v<>"):
        for ax, field in ((ax_c, "ecr"), (ax_s, "apss")):
            ys = [r[m][field] for r in results]
            line = ax.plot(alphas, ys, marker=marker, label=LABELS[m])[0]
            hollow = [(a, y) for a, y, r in zip(alphas, ys, results) if r[m]["abstained"]]
            if hollow:
                ax.scatter(*zip(*hollow), s=90, facecolors="white", edgecolors=line.get_color(), zorder=3)
    ax_c.set(xlabel="α (user error rate)", ylabel="empirical coverage (ECR)", ylim=(0, 1.02))
    ax_s.set(xlabel="α (user error rate)", ylabel="average set size (APSS)", yscale="log")
    ax_c.legend(fontsize=8)
    ax_s.legend(fontsize=8, title="hollow = abstained", title_fontsize=7)
    for ax in (ax_c, ax_s):
        ax.grid(alpha=0.3)
    fig.suptitle(title or "UAG vs baselines on the test split")
    out = save_figure(fig, path)
    plt.close(fig)
    return out


def write_sweep(results: Sequence[dict[str, Any]], output_dir: str | Path, meta: dict[str, Any]) -> dict[str, Path]:
    """``sweep.json``, ``sweep.md`` and ``coverage_vs_alpha.png`` under ``output_dir``."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {kind: out / name for kind, name in zip(("json", "md", "png"), SWEEP_FILES)}
    write_text_atomic(paths["json"], json.dumps({"meta": meta, "results": list(results)}, indent=2) + "\n")
    write_text_atomic(paths["md"], sweep_markdown(results) + "\n")
    plot_sweep(results, paths["png"])
    return paths
