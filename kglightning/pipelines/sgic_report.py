"""SGIC's report: EM/F1 per method and per round, uncertainty AUROC, inference cost, and the trajectory plot."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torchmetrics.functional.classification import binary_auroc

from kglightning.metrics.plots import save_figure

__all__ = ["METHODS", "TRANSITIONS", "plot_trajectories", "summarize", "summary_markdown", "uncertainty_auroc"]

#: the compared methods, in table order
METHODS: tuple[str, ...] = ("baseline", "k_sampling", "sgic")
#: how the answer changed between round 0 and the final (minimum-uncertainty) answer (the paper's Fig. 4)
TRANSITIONS: tuple[str, ...] = (
    "correct => correct",
    "incorrect => correct",
    "correct => incorrect",
    "incorrect => incorrect",
)


def uncertainty_auroc(uncertainty: Sequence[float], correct: Sequence[float]) -> float | None:
    """AUROC of ``100 - uncertainty`` for telling correct answers from wrong ones (``None`` with one class only).

    >>> uncertainty_auroc([10, 20, 80, 90], [1, 1, 0, 0]), uncertainty_auroc([10, 20], [1, 1])
    (1.0, None)
    """
    labels = torch.tensor([c > 0 for c in correct], dtype=torch.long, device="cpu")
    if labels.numel() == 0 or labels.min() == labels.max():
        return None
    scores = 100.0 - torch.tensor(list(uncertainty), dtype=torch.float64, device="cpu")
    return round(float(binary_auroc(scores, labels)), 4)


def _mean(values: Sequence[float]) -> float:
    return round(100.0 * sum(values) / len(values), 2) if values else 0.0


def transition(row: Mapping[str, Any]) -> str:
    """How the answer's correctness (``correct``: EM or Hit) changed from round 0 to the final round."""
    first = "correct" if row["rounds"][0]["correct"] else "incorrect"
    last = "correct" if row["rounds"][row["final_round"]]["correct"] else "incorrect"
    return f"{first} => {last}"


def summarize(
    rows: Sequence[Mapping[str, Any]],
    rounds: int,
    cost: Mapping[str, Mapping[str, float]],
    counts: Mapping[str, int],
    mean: float | None,
) -> dict[str, Any]:
    """EM, Hit, F1 and AUROC (of ``correct``) per method and per round, the transitions, the cost per question and the counters.

    EM and F1 are percentages; cost is per question (tokens and seconds of every backend call a method needs:
    ``baseline`` round 0; ``sgic`` round 0, the document scores and the K rounds; ``k_sampling`` its samples).
    """
    n = len(rows)
    methods: dict[str, dict[str, Any]] = {}
    for m in METHODS:
        got = [r["methods"][m] for r in rows if m in r["methods"]]
        if not got:
            continue
        c = cost.get(m, {})
        methods[m] = {
            "EM": _mean([g["em"] for g in got]),
            "Hit": _mean([g["hit"] for g in got]),
            "F1": _mean([g["f1"] for g in got]),
            "AUROC": uncertainty_auroc([g["uncertainty"] for g in got], [g["correct"] for g in got]),
            "prompt_tokens": round(c.get("prompt_tokens", 0) / max(n, 1), 1),
            "completion_tokens": round(c.get("completion_tokens", 0) / max(n, 1), 1),
            "seconds": round(c.get("seconds", 0.0) / max(n, 1), 3),
            "cached_calls": int(c.get("cached", 0)),
        }
    per_round = []
    for k in range(rounds + 1):
        got = [r["rounds"][k] for r in rows if len(r["rounds"]) > k]
        per_round.append(
            {
                "round": k,
                "EM": _mean([g["em"] for g in got]),
                "Hit": _mean([g["hit"] for g in got]),
                "F1": _mean([g["f1"] for g in got]),
                "uncertainty": round(sum(g["uncertainty"] for g in got) / max(len(got), 1), 2),
                "AUROC": uncertainty_auroc([g["uncertainty"] for g in got], [g["correct"] for g in got]),
                "chosen": sum(r["final_round"] == k for r in rows),
            }
        )
    changed = Counter(transition(r) for r in rows)
    return {
        "questions": n,
        "rounds": rounds,
        "answer_mean": mean,
        "methods": methods,
        "per_round": per_round,
        "transitions": {t: changed.get(t, 0) for t in TRANSITIONS},
        "counts": dict(counts),
    }


def _cell(v: Any) -> str:
    return "n/a" if v is None else f"{v}"


def summary_markdown(summary: Mapping[str, Any]) -> str:
    """The summary as two Markdown tables (methods, rounds) and a line of counters."""
    lines = [
        "| method | EM | Hit | F1 | AUROC | prompt tokens/q | generated tokens/q | s/q |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m, r in summary["methods"].items():
        cells = [r["EM"], r["Hit"], r["F1"], r["AUROC"], r["prompt_tokens"], r["completion_tokens"], r["seconds"]]
        lines.append(f"| {m} | " + " | ".join(_cell(v) for v in cells) + " |")
    lines += ["", "| round | EM | Hit | F1 | mean uncertainty | AUROC | chosen as final |",
              "|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in summary["per_round"]:
        cells = [r["round"], r["EM"], r["Hit"], r["F1"], r["uncertainty"], r["AUROC"], r["chosen"]]
        lines.append("| " + " | ".join(_cell(v) for v in cells) + " |")
    cached = sum(r.get("cached_calls", 0) for r in summary["methods"].values())
    if cached:
        lines += ["", f"s/q counts only generated answers: {cached} backend calls were read from the response cache "
                  "(0 s each); clear the cache for timings"]  # fmt: skip
    trans = ", ".join(f"{k}: {v}" for k, v in summary["transitions"].items())
    counts = ", ".join(f"{k}: {v}" for k, v in summary["counts"].items())
    lines += ["", f"round 0 -> final: {trans}", f"counts: {counts}", ""]
    return "\n".join(lines)


def plot_trajectories(rows: Sequence[Mapping[str, Any]], path: str | Path, examples: int = 10) -> Path:
    """Mean uncertainty by round for each transition (left), and ``examples`` single questions (right)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    for name in TRANSITIONS:
        group = [r for r in rows if transition(r) == name]
        if not group:
            continue
        width = min(len(r["rounds"]) for r in group)
        means = [sum(r["rounds"][k]["uncertainty"] for r in group) / len(group) for k in range(width)]
        left.plot(range(width), means, marker="o", label=f"{name} ({len(group)})")
    left.set(xlabel="round", ylabel="mean answer uncertainty (0-100)", title="By change from round 0 to final")
    left.legend(fontsize=8)
    for r in list(rows)[:examples]:
        ks = [x["round"] for x in r["rounds"]]
        us = [x["uncertainty"] for x in r["rounds"]]
        right.plot(ks, us, color="0.7", linewidth=0.8)
        right.scatter(ks, us, c=["tab:green" if x["correct"] else "tab:red" for x in r["rounds"]], s=18, zorder=3)
    right.set(
        xlabel="round", ylabel="answer uncertainty", title=f"{min(examples, len(rows))} questions (green: correct)"
    )
    return save_figure(fig, path)
