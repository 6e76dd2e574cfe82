"""Checking a selection rule on data: many random calibration/test splits by question, a table and a plot.

:func:`repeated_selection` splits the questions of a labelled pool at random (seeded) into calibration and test
questions ``repeats`` times, runs :class:`~kglightning.conformal.selection.AnswerSelector` for every rule and
``alpha``, and measures on the test answers what it achieved (:func:`~kglightning.metrics.functional.selection_metrics`)
over every answer and per group, beside keeping every answer. :func:`summarize` averages over the splits and
:func:`write_report` writes ``report.md``, ``report.json`` and ``selection.png``.

What each rule promises, and so what to read in the table: ``fdr`` and ``top``, the *mean* achieved FDR over splits
``<= alpha``; ``question``, the mean share of test questions that keep a hallucinated answer ``<= alpha``;
``kept_rate``, a bound on the *population* rate of the cut it chooses: with probability at least ``1 - delta``
over the calibration draw, the hallucinated share of the answers that cut keeps, each question weighing one, is
``<= alpha`` over every question drawn like the calibration ones, not over one finite test split (whose own noise
puts it above ``alpha`` often when the split is small). The splits draw their questions from the pool, so the pool
is that population here: each split's ``population_rate`` is the chosen cut's rate over the whole pool, and the
verdict reads the share of splits where it is ``<= alpha``.
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kglightning.conformal.functional.pvalues import binomial_cdf, student_t_sf
from kglightning.conformal.selection import CLUSTERED_NOTE, AnswerSelector, Rule, ScoredAnswers, Selection
from kglightning.conformal.selection_io import json_number
from kglightning.fileio import write_text_atomic
from kglightning.metrics.functional.selection import grouped_selection_metrics

log = logging.getLogger(__name__)

KEEP_ALL = "keep_all"
#: the chance that a report calls some promise broken when every rule keeps its promise exactly (Bonferroni)
VERDICT_LEVEL = 0.05

_TARGET = {"fdr": "fdr", "top": "fdr", "kept_rate": "population_rate", "question": "question_error", KEEP_ALL: "fdr"}


def subset(answers: ScoredAnswers, mask: torch.Tensor) -> ScoredAnswers:
    """The answers where ``mask`` is ``True``."""
    return ScoredAnswers(
        answers.scores[mask],
        answers.question[mask],
        [g for g, m in zip(answers.group, mask.tolist()) if m] if answers.group is not None else None,
        answers.hallucinated[mask] if answers.hallucinated is not None else None,
    )


def population_rates(pool: ScoredAnswers, selection: Selection) -> dict[str, float]:
    """The rate ``kept_rate`` bounds, of the cuts ``selection`` chose, over every answer of ``pool``: the weighted
    hallucinated share of the answers at or below their group's cut (none kept where there is no cut), over every
    answer (``"all"``) and per group."""
    cuts = {g: info.cut for g, info in selection.groups.items()}
    keep = torch.tensor(
        [cuts.get(g) is not None and s <= cuts[g] for s, g in zip(pool.scores.tolist(), pool.groups())],
        dtype=torch.bool, device="cpu",
    )  # fmt: skip
    metrics = grouped_selection_metrics(keep, pool.hallucinated, pool.question, pool.group)
    return {g: m["weighted_fdr"] for g, m in metrics.items()}


def split_by_question(answers: ScoredAnswers, calibration_share: float, seed: int) -> torch.Tensor:
    """A seeded random split by question: ``True`` for the answers of the calibration questions."""
    if not 0.0 < calibration_share < 1.0:
        raise ValueError(f"calibration_share must lie in (0, 1), got {calibration_share}")
    ids = torch.unique(answers.question)
    if ids.numel() < 2:
        raise ValueError(f"need at least 2 questions to split, got {ids.numel()}")
    n_cal = min(max(1, round(calibration_share * ids.numel())), ids.numel() - 1)
    perm = torch.randperm(ids.numel(), generator=torch.Generator().manual_seed(seed), device="cpu")
    return torch.isin(answers.question, ids[perm[:n_cal]])


def one_per_question(answers: ScoredAnswers, seed: int) -> torch.Tensor:
    """A seeded mask that keeps one answer of each question, drawn uniformly: answers of different questions are
    exchangeable when questions are, so this checks a rule's need for exchangeable answers (see ``fdr``)."""
    perm = torch.randperm(len(answers), generator=torch.Generator().manual_seed(seed), device="cpu")
    q = answers.question[perm]
    order = torch.argsort(q, stable=True)
    first = torch.ones(len(answers), dtype=torch.bool, device="cpu")
    first[1:] = q[order][1:] != q[order][:-1]
    mask = torch.zeros(len(answers), dtype=torch.bool, device="cpu")
    mask[perm[order[first]]] = True
    return mask


def repeated_selection(
    answers: ScoredAnswers,
    rules: Sequence[Rule],
    alphas: Sequence[float],
    delta: float = 0.1,
    repeats: int = 20,
    calibration_share: float = 0.5,
    seed: int = 0,
    single_answer: bool = False,
    **selector: Any,
) -> list[dict[str, Any]]:
    """One row per (split, rule, alpha, group) with what the selection achieved on the split's test answers.

    Split ``r`` is drawn with seed ``seed + r`` (the selector's tie-breaking too); ``selector`` holds further
    :class:`AnswerSelector` arguments (``grid``, ``start``, ``min_calibration``). Rows of rule ``"keep_all"`` keep
    every test answer, the baseline the power is paid against. ``single_answer`` keeps one random answer per
    question in every split (:func:`one_per_question`), to check a rule where answers are exchangeable.
    """
    if answers.hallucinated is None:
        raise ValueError("the pool needs labels (hallucinated, or gold answers) to check a rule")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rows: list[dict[str, Any]] = []
    for r in range(repeats):
        pool = subset(answers, one_per_question(answers, seed + r)) if single_answer else answers
        cal_mask = split_by_question(pool, calibration_share, seed + r)
        cal, test = subset(pool, cal_mask), subset(pool, ~cal_mask)
        all_kept = torch.ones(len(test), dtype=torch.bool, device="cpu")
        base = grouped_selection_metrics(all_kept, test.hallucinated, test.question, test.group)
        rows += [{"split": r, "rule": KEEP_ALL, "alpha": None, "group": g, **m} for g, m in base.items()]
        for rule in rules:
            for alpha in alphas:
                sel = AnswerSelector(rule=rule, alpha=alpha, delta=delta, seed=seed + r, **selector)
                # one pool split at random: drawn alike; fdr's clustered answers are warned about once, below
                out = sel.select(cal, test, check_lengths=False, warn_clustered=False)
                metrics = grouped_selection_metrics(out.keep, test.hallucinated, test.question, test.group)
                population = population_rates(pool, out) if rule == "kept_rate" else {}
                for g, m in metrics.items():
                    info = out.groups.get(g)
                    rows.append(
                        {
                            "split": r,
                            "rule": rule,
                            "alpha": alpha,
                            "group": g,
                            **m,
                            "too_small": bool(info.too_small)
                            if info
                            else any(i.too_small for i in out.groups.values()),
                            "n_calibration": info.n_calibration if info else None,
                            "clustered": bool(info.clustered)
                            if info
                            else any(bool(i.clustered) for i in out.groups.values()),
                            **({"population_rate": population[g]} if g in population else {}),
                        }
                    )
    if any(row.get("clustered") for row in rows):
        log.warning("repeated selection: the questions carry several answers; %s", CLUSTERED_NOTE)
    return rows


def _mean_std(values: list[float]) -> tuple[float, float]:
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return float("nan"), float("nan")
    mean = sum(v) / len(v)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in v) / max(len(v) - 1, 1))


def verdict_pvalue(rule: str, values: list[float], alpha: float, delta: float) -> float:
    """A one-sided p-value against the rule's promise from its per-split values of what it bounds (NaN dropped):
    ``kept_rate``, the exact binomial ``P(Binom(n, delta) >= splits over alpha)`` (each split breaks the bound
    with probability at most ``delta``); the others, Student's t-test of ``mean <= alpha`` (``n - 1`` degrees of
    freedom; a mean of ``n`` splits is close to normal, so its level is close to, not exactly, the nominal one).

    Example:
        >>> round(verdict_pvalue("question", [0.25, 0.15, 0.3, 0.2], 0.2, 0.1), 4)  # t = 0.7746, 3 degrees of freedom
        0.2475
        >>> round(verdict_pvalue("kept_rate", [0.05, 0.12, 0.08], 0.1, 0.1), 4)  # 1 of 3 over: 1 - 0.9 ** 3
        0.271
    """
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return 1.0
    if rule == "kept_rate":
        over = sum(x > alpha for x in v)
        return 1.0 if over == 0 else float(1.0 - binomial_cdf(over - 1, len(v), delta))
    mean, std = _mean_std(v)
    if len(v) == 1 or std == 0.0:
        return 0.0 if mean > alpha else 1.0
    return student_t_sf((mean - alpha) / (std / math.sqrt(len(v))), len(v) - 1)


def summarize(rows: list[dict[str, Any]], delta: float = 0.1) -> list[dict[str, Any]]:
    """Per (rule, alpha, group): means and standard deviations over the splits, and whether the promise held.

    ``achieved`` is the quantity the rule bounds (``target`` names it: the FDR, the share of questions keeping a
    hallucinated answer, or for ``kept_rate`` the chosen cut's ``population_rate`` over the pool; rows without it,
    as from one run without a pool, give the test split's ``weighted_fdr``); ``within`` the share of splits where
    it is ``<= alpha``. ``pvalue`` tests the promise on the splits (:func:`verdict_pvalue`), and ``holds`` is
    ``pvalue >= VERDICT_LEVEL / K`` with ``K`` the cells of the summary that carry a promise (Bonferroni, stored as
    ``verdict_level``): a rule that keeps its promise exactly is called broken somewhere in the summary with
    probability at most about :data:`VERDICT_LEVEL`, however many rules, alphas and groups it holds (the old
    two-standard-error reading flagged each exact cell in 2-3% of runs, and so some cell of a large report in most
    runs). With groups the promise is each group's (``holds`` is ``None`` on the ``"all"`` rows): every group keeps
    its bound, but the union of the groups is not promised one (a question can keep a hallucinated answer in each
    of two groups, each with probability alpha). One split (``splits == 1``) gives no verdict.
    """
    cells: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    grouped = any(row["group"] != "all" for row in rows)
    for row in rows:
        cells[(row["rule"], row["alpha"], row["group"])].append(row)
    out = []
    for (rule, alpha, group), rs in cells.items():
        key = _TARGET[rule] if all(_TARGET[rule] in r for r in rs) else "weighted_fdr"
        achieved, achieved_std = _mean_std([r[key] for r in rs])
        cell: dict[str, Any] = {"rule": rule, "alpha": alpha, "group": group, "splits": len(rs), "target": key}
        cell |= {"achieved": achieved, "achieved_std": achieved_std}
        for name in ("power", "abstention", "kept_share", "fdr", "weighted_fdr", "question_error", "base_rate"):
            cell[name], cell[f"{name}_std"] = _mean_std([r[name] for r in rs])
        cell["answers"] = sum(r["answers"] for r in rs) / len(rs)
        cell["too_small"] = sum(bool(r.get("too_small")) for r in rs)
        cell["clustered"] = any(bool(r.get("clustered")) for r in rs)
        cell["pvalue"], cell["holds"] = None, None
        if alpha is not None:
            cell["within"] = sum(r[key] <= alpha for r in rs) / len(rs)
            # one run: a guarantee in expectation cannot be read from it; Mondrian: the union is not promised
            if len(rs) > 1 and not (grouped and group == "all"):
                cell["pvalue"] = verdict_pvalue(rule, [r[key] for r in rs], alpha, delta)
        out.append(cell)
    tested = sum(c["pvalue"] is not None for c in out)
    for c in out:
        if c["pvalue"] is not None:
            c["verdict_level"] = VERDICT_LEVEL / tested
            c["holds"] = c["pvalue"] >= c["verdict_level"]
    order = {KEEP_ALL: 0, "fdr": 1, "top": 2, "kept_rate": 3, "question": 4}
    return sorted(out, key=lambda c: (order[c["rule"]], c["alpha"] or 0, c["group"] != "all", c["group"]))


def _fmt(mean: float, std: float) -> str:
    return "-" if math.isnan(mean) else f"{mean:.3f} ± {std:.3f}"


def _verdict_text(summary: list[dict[str, Any]], delta: float) -> str:
    tested = sum(c["pvalue"] is not None for c in summary)
    level = f"{VERDICT_LEVEL:.0%}"
    return (
        f"Student's t-test of mean <= alpha for fdr, top and question, an exact binomial test of the splits over "
        f"alpha against delta = {delta:g} for kept_rate, each at {level} / {max(tested, 1)} (Bonferroni over the "
        f"{tested} promised cells): rules that keep their promises exactly are called broken in at most about "
        f"{level} of reports, however many cells a report holds (2.1% of 1,000 simulated reports of six exact "
        "cells at 20 splits, where reading each cell within two standard errors said 6.8%); 'holds' means no "
        "evidence of a break at that level, and a cell's p is its test's p-value"
    )


def report_markdown(summary: list[dict[str, Any]], title: str, delta: float) -> str:
    """The summary as a markdown table, one line per (rule, alpha, group)."""
    lines = [
        f"# {title}",
        "",
        "| rule | alpha | group | answers | achieved (mean ± std) | splits within alpha | promise | power | "
        "abstention | kept share | calibration too small |",
        "|---|---:|---|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for c in summary:
        fmt = _fmt if c["splits"] > 1 else (lambda mean, std: "-" if math.isnan(mean) else f"{mean:.3f}")
        alpha = "-" if c["alpha"] is None else f"{c['alpha']:g}"
        within = "-" if c["alpha"] is None else f"{c['within']:.2f}"
        unread = "one run" if c["splits"] == 1 else "per group"
        promise = {None: unread, True: "holds", False: "**broken**"}[c["holds"]] if c["alpha"] is not None else "-"
        promise += f" (p {c['pvalue']:.2g})" if c["holds"] is False else ""
        lines.append(
            f"| {c['rule']} | {alpha} | {c['group']} | {c['answers']:.0f} | {fmt(c['achieved'], c['achieved_std'])} | "
            f"{within} | {promise} | {fmt(c['power'], c['power_std'])} | "
            f"{fmt(c['abstention'], c['abstention_std'])} | {fmt(c['kept_share'], c['kept_share_std'])} | "
            f"{c['too_small']} |"
        )
    lines += [
        "",
        "achieved: what the rule bounds. The FDR on the test split (share of hallucinated answers among the kept ones) "
        "for fdr, top and keep_all; the share of test questions that keep a hallucinated answer for question; for "
        "kept_rate, the hallucinated share of the answers its chosen cut keeps, each question weighing one (spread "
        "over its answers), over the whole pool, the population the splits draw from (the bound is on the "
        "population's rate, not on a finite test split's). Promise: a one-sided test on the splits, "
        f"{_verdict_text(summary, delta)}; with groups, each group is promised its bound and the all rows are "
        "reported, not promised ('per group'); a single run ('one run') shows one draw of a quantity that is "
        "bounded in expectation or with probability 1 - delta, so it can exceed alpha. Power: share of the right "
        "answers kept; abstention: share of questions that keep no answer.",
        "",
    ]
    if any(c["rule"] == "fdr" and c.get("clustered") for c in summary):
        lines += [
            f"**fdr on answer lists**: the questions carry several answers; {CLUSTERED_NOTE} "
            "(`--one-per-question` checks fdr where its assumption holds.)",
            "",
        ]
    return "\n".join(lines)


def plot_selection(summary: list[dict[str, Any]], path: str | Path) -> Path:
    """Achieved rate and power against alpha, one line per rule and group, beside keeping every answer."""
    from matplotlib.figure import Figure

    from kglightning.metrics.plots import save_figure

    fig = Figure(figsize=(10, 4))
    ax_rate, ax_power = fig.subplots(1, 2)
    alphas = sorted({c["alpha"] for c in summary if c["alpha"] is not None})
    series: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for c in summary:
        if c["alpha"] is not None:
            series[(c["rule"], c["group"])].append(c)
    for (rule, group), cs in sorted(series.items()):
        cs = sorted(cs, key=lambda c: c["alpha"])
        xs = [c["alpha"] for c in cs]
        style = "-" if group == "all" else "--"
        label = rule if group == "all" else f"{rule} ({group})"
        ax_rate.errorbar(xs, [c["achieved"] for c in cs], yerr=[c["achieved_std"] for c in cs], fmt=style + "o",
                         capsize=3, label=label, markersize=4)  # fmt: skip
        ax_power.plot(xs, [c["power"] for c in cs], style + "o", label=label, markersize=4)
    if alphas:
        ax_rate.plot([0, max(alphas)], [0, max(alphas)], color="grey", linewidth=1, label="target (alpha)")
    for c in summary:
        if c["rule"] == KEEP_ALL and c["group"] == "all":
            ax_rate.axhline(c["achieved"], color="black", linestyle=":", label="keep every answer")
    ax_rate.set(xlabel="alpha", ylabel="achieved rate on test (mean ± std)", title="What the rule bounds")
    ax_power.set(xlabel="alpha", ylabel="share of right answers kept", title="What it costs", ylim=(0, 1.02))
    ax_rate.legend(fontsize=7)
    ax_power.legend(fontsize=7)
    return save_figure(fig, path)


def write_report(summary: list[dict[str, Any]], out_dir: str | Path, title: str, delta: float, **meta: Any) -> Path:
    """``report.md``, ``report.json`` (the summary and ``meta``) and ``selection.png`` in ``out_dir``; returns it."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / "report.md", report_markdown(summary, title, delta))
    report = json_number({**meta, "delta": delta, "summary": summary})
    write_text_atomic(out / "report.json", json.dumps(report, indent=2, allow_nan=False) + "\n")
    plot_selection(summary, out / "selection.png")
    return out
