"""Scoring and comparing evidence proxies on the same held-out questions (DoublyCal §4.2; SFT vs GRPO or any adapters).

Per question, a proxy's first well-formed ``<PATH confidence=ĉ>`` block ``ẑ`` (greedy decoding) is grounded in the
question's graph, which gives its *Bayesian target* ``c = p(A | ẑ)`` (Eq. 4, the number the SFT data teaches) and
its grounded answers. A proxy's row reports:

* ``reward``: :class:`~kglightning.evidence.rewards.EvidenceReward` of the output (−3 when invalid), the RL objective;
* ``invalid``: the share of outputs without a well-formed block with a confidence;
* ``match``: the best match score ``m(ẑ, z)`` over the question's gold evidence (0 when invalid);
* ``hit`` / ``f1``: whether the grounded answers hold a gold answer, and their F1 against the gold answers (0 when
  invalid);
* ``target_ece``: ECE of ``ĉ`` against ``c`` (10 equal-width bins over ``ĉ``; valid outputs only): does the stated
  confidence say what the evidence is worth;
* ``answer_ece``: ECE of ``ĉ`` against ``hit``;
* ``distinct``: distinct stated confidences / valid outputs (a proxy that always writes 0.75 has ``1/n``);
* ``spearman``: rank correlation of ``ĉ`` with ``c`` (NaN when either is constant).

Rates are ×100 in the table, as in the rest of the toolkit. Only questions with gold evidence are scored (the
others have nothing to match against); their number is reported.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from kglightning.data.records import KGQARecord
from kglightning.evidence.builder import EvidenceBuilder
from kglightning.evidence.format import parse_evidence
from kglightning.evidence.rewards import EvidenceReward, evidence_items, match_score
from kglightning.fileio import write_text_atomic
from kglightning.metrics.functional import expected_calibration_error, target_calibration_error
from kglightning.metrics.plots import save_figure

__all__ = ["COLUMNS", "comparison_table", "plot_confidence_targets", "score_proxy", "write_proxy_comparison"]

COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("Questions", "n_questions", False),
    ("Reward", "reward", False),
    ("Invalid %", "invalid", True),
    ("Match %", "match", True),
    ("Hit %", "hit", True),
    ("F1 %", "f1", True),
    ("ECE vs target ↓", "target_ece", True),
    ("ECE vs hit ↓", "answer_ece", True),
    ("Distinct conf. %", "distinct", True),
    ("Spearman ρ", "spearman", False),
)
"""The table's columns: (header, key, shown ×100)."""


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _spearman(a: Sequence[float], b: Sequence[float]) -> float:
    from torchmetrics.functional import spearman_corrcoef

    if len(a) < 2 or len(set(a)) < 2 or len(set(b)) < 2:
        return math.nan
    x, y = (torch.tensor(v, dtype=torch.float64, device="cpu") for v in (a, b))
    return float(spearman_corrcoef(x, y))


def score_proxy(
    rows: Sequence[Mapping[str, Any]],
    records: Mapping[str, KGQARecord],
    gold: Mapping[str, Sequence[Mapping[str, Any]]],
    builder: EvidenceBuilder,
    reward: EvidenceReward | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Score one proxy's predict rows (see the module docstring).

    Args:
        rows: :meth:`~kglightning.modules.ProxySFT.predict_step` rows (``id`` and ``raw``, the generated texts).
        records: the questions by id, with their graphs.
        gold: the gold evidence per question id (:func:`~kglightning.evidence.rewards.gold_target` dicts); a
            question without any is not scored.
        builder: grounds and scores the generated evidence (use the one that mined the gold evidence).
        reward: the reward (default :class:`EvidenceReward` with the paper's settings).

    Returns:
        ``(summary, details)``: the row of the table (rates in ``[0, 1]``) and one dict per scored question.
    """
    reward = reward or EvidenceReward()
    details: list[dict[str, Any]] = []
    for row in rows:
        targets = gold.get(row["id"]) or []
        if not targets:
            continue
        record = records[row["id"]]
        text = row["raw"][0] if row["raw"] else ""
        blocks = [z for z in parse_evidence(text, require_confidence=True).evidence if z.confidence is not None]
        out: dict[str, Any] = {"id": row["id"], "text": text, "reward": reward.score(text, targets), "valid": False}
        out.update(match=0.0, hit=0.0, f1=0.0, stated=None, target=None)
        if blocks:
            z = blocks[0]
            constraint = None if z.constraint is None else (z.constraint.relation, z.constraint.entity)
            items = evidence_items(z.relations, constraint)
            scored = builder.score(record, z.to_evidence(None))
            hits, grounded = scored.hits or 0, scored.grounded or 0
            answers = len(dict.fromkeys(record.a_entity))
            precision, recall = (hits / grounded if grounded else 0.0), (hits / answers if answers else 0.0)
            out.update(
                valid=True,
                match=max(match_score(items, t["items"], reward.jaccard_weight) for t in targets),
                hit=float(hits > 0),
                f1=2 * precision * recall / (precision + recall) if precision + recall else 0.0,
                stated=float(z.confidence),
                target=float(scored.confidence),
            )
        details.append(out)
    valid = [d for d in details if d["valid"]]
    stated, target = [d["stated"] for d in valid], [d["target"] for d in valid]
    summary = {
        "n_questions": float(len(details)),
        "reward": _mean([d["reward"] for d in details]),
        "invalid": 1.0 - len(valid) / len(details) if details else math.nan,
        "match": _mean([d["match"] for d in details]),
        "hit": _mean([d["hit"] for d in details]),
        "f1": _mean([d["f1"] for d in details]),
        "target_ece": float(target_calibration_error(stated, target)) if valid else math.nan,
        "answer_ece": float(expected_calibration_error(stated, [d["hit"] for d in valid])) if valid else math.nan,
        "distinct": len(set(stated)) / len(stated) if stated else math.nan,
        "spearman": _spearman(stated, target),
    }
    return summary, details


def _cell(value: float, percent: bool) -> str:
    if value is None or math.isnan(value):
        return "–"
    if percent:
        return f"{100 * value:.1f}"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3f}"


def comparison_table(results: Mapping[str, Mapping[str, float]]) -> str:
    """A markdown table, one row per proxy.

    Example:
        >>> print(comparison_table({"sft": {"n_questions": 2, "reward": 0.5, "invalid": 0.5, "spearman": float("nan")}}))
        | Proxy | Questions | Reward | Invalid % | Match % | Hit % | F1 % | ECE vs target ↓ | ECE vs hit ↓ | Distinct conf. % | Spearman ρ |
        |---|---|---|---|---|---|---|---|---|---|---|
        | sft | 2 | 0.500 | 50.0 | – | – | – | – | – | – | – |
    """
    head = "| Proxy | " + " | ".join(h for h, _, _ in COLUMNS) + " |"
    rule = "|---" * (len(COLUMNS) + 1) + "|"
    body = [
        f"| {name} | " + " | ".join(_cell(r.get(k, math.nan), pct) for _, k, pct in COLUMNS) + " |"
        for name, r in results.items()
    ]
    return "\n".join([head, rule, *body])


def plot_confidence_targets(details: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path) -> Path:
    """Stated confidence against the Bayesian target of the written evidence, one colour per proxy.

    Points on the diagonal are calibrated evidence; a horizontal band is a proxy that writes one number whatever
    the evidence is worth.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", label="stated = target")
    for k, (name, rows) in enumerate(details.items()):
        pts = [(d["target"], d["stated"]) for d in rows if d["valid"]]
        if not pts:
            continue
        jitter = torch.linspace(-0.008, 0.008, len(pts), device="cpu").tolist()  # separates equal points; deterministic
        xs = [x + j for (x, _), j in zip(pts, jitter)]
        ys = [y + (k - 0.5) * 0.01 for _, y in pts]
        rho = _spearman([y for _, y in pts], [x for x, _ in pts])
        ax.scatter(xs, ys, s=14, alpha=0.6, label=f"{name} (n={len(pts)}, ρ={rho:.2f})")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("Bayesian confidence of the written evidence, p(A | z)")
    ax.set_ylabel("stated confidence")
    ax.set_title("Evidence confidence by proxy")
    ax.legend(loc="upper left", fontsize="small")
    return save_figure(fig, path)


def write_proxy_comparison(
    results: Mapping[str, Mapping[str, float]],
    details: Mapping[str, Sequence[Mapping[str, Any]]],
    output_dir: str | Path,
) -> dict[str, Path]:
    """Write ``proxy_comparison.md``, ``proxy_comparison.json``, ``proxy_confidence.png`` and ``<name>.jsonl``.

    Returns:
        The written files by kind (``table``, ``json``, ``plot``, and one per proxy).
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = {"table": out / "proxy_comparison.md", "json": out / "proxy_comparison.json"}
    write_text_atomic(files["table"], comparison_table(results) + "\n")
    clean = {
        n: {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
        for n, r in results.items()
    }
    write_text_atomic(files["json"], json.dumps(clean, indent=2) + "\n")
    files["plot"] = plot_confidence_targets(details, out / "proxy_confidence.png")
    for name, rows in details.items():
        path = out / f"{name}.jsonl"
        write_text_atomic(path, "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in rows))
        files[name] = path
    return files
