"""What a trained hallucination detector catches and misses, and where a baseline beats it.

Loads a config's DetectionDataModule and a checkpoint, scores every test answer (each flagged at its population's
threshold: grounded answers at ``threshold``, ungrounded ones at ``ungrounded_threshold``), and groups them:

* by how the answer was grounded (``exact``, ``near-miss``, ``ungrounded``), its place in the LLM's list, the
  list's length, the LLM's votes for it, and whether the question's graph has any triple;
* on the embedded benchmark, by the question's ``kind`` and gold ``hops`` (record fields; left out when absent);
* hallucinated answers by kind of mistake, read from the subgraph: ``answer not in subgraph`` (no gold answer in
  the question's graph), ``unreachable`` (no path from a topic entity within 4 hops), ``shorter path``, ``longer
  path`` or ``same length, other relations`` than the gold path, ``not a node`` for an ungrounded answer.

For each group: answers, the share hallucinated, recall (hallucinated answers flagged), false alarms (faithful ones
flagged), F1, and AUC-PR, for the detector and for each baseline the config's data module scores (e.g.
``StructuralBaseline``, flagged at 0.5), so that the groups where a cheap baseline ranks better stand out. Writes
``misses.md`` and ``misses.json`` to ``--output``.

    PYTHONPATH=. python tools/detector_misses.py --config configs/detector.yaml \\
        --ckpt outputs/detector/graph_transformer/checkpoints/best.ckpt --output outputs/detector/misses
    PYTHONPATH=. python tools/detector_misses.py --config configs/detector_real.yaml --ckpt best.ckpt \\
        --data.init_args.data_dir data/gnn_rag_webqsp --output outputs/detector_real/misses
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch


def mistake_kind(record, name: str, grounded: bool) -> str:
    """How a hallucinated answer went wrong, read from the subgraph (see the module docstring)."""
    from kglightning.datamodules.detection_graphs import answer_paths

    if not grounded:
        return "not a node"
    extra = record.extra
    if extra.get("answer_in_graph") is False:
        return "answer not in subgraph"
    ((hops, texts),) = answer_paths(record, [name], max_hops=4)
    if hops is None:
        return "unreachable"
    gold = extra.get("hops")
    if gold is None:  # records without the gold path's length (real LLM answers): no kind to read
        return "a graph node (no gold path to compare)"
    if hops != gold:
        return "shorter path" if hops < gold else "longer path"
    return "same length, other relations"


def _bucket(value: int, edges: tuple[int, ...]) -> str:
    """``value`` as one of the ranges ``1``, ``2-3``, ... cut at ``edges`` (the last one open)."""
    lo = 1
    for hi in edges:
        if value <= hi:
            return str(lo) if lo == hi else f"{lo}-{hi}"
        lo = hi + 1
    return f">{edges[-1]}"


def score_nodes(config: str, ckpt: str, overrides: list[str]) -> tuple[list[dict], list[str]]:
    """Every test answer as a row (the detector's probability and flag, each baseline's score, the groups), and the
    baselines' names."""
    from kglightning.cli.trainer import configured
    from kglightning.datamodules.detection_graphs import GROUNDING_KINDS, answer_owner
    from kglightning.evidence.answer_signals import SIGNALS
    from kglightning.modules import HallucinationDetector

    cli = configured("predict", args=["--config", config, *overrides])
    dm = cli.datamodule
    dm.prepare_data()
    dm.setup("test")
    model = cli.model  # built from the config, so its encoder matches the checkpoint's
    if not isinstance(model, HallucinationDetector):
        raise TypeError(f"{config} does not configure a HallucinationDetector")
    model.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"])
    model.eval()
    records = {r.id: r for r in dm.records("test")}
    baselines = list(getattr(dm, "baseline_names", []))
    rows = []
    with torch.no_grad():
        for batch in dm.test_dataloader():
            probs = torch.sigmoid(model(batch))
            kinds = batch.answer_grounding if hasattr(batch, "answer_grounding") else torch.zeros_like(batch.y).long()
            flags = probs >= model.answer_thresholds(kinds != 2)
            owner = answer_owner(batch)
            scores = getattr(batch, "baseline_scores", None)
            for a, (g, kind) in enumerate(zip(owner.tolist(), kinds.tolist())):
                qid = batch.qid[g]
                r = records[qid]
                position = sum(1 for k in range(a) if owner[k] == g)
                name = batch.answer_names[g][position]
                preds = r.prediction or []
                signal = dict(zip(SIGNALS, batch.answer_signals[a].tolist()))  # of every entry naming the answer
                first, votes = round(signal["first_rank"] * len(preds)), round(signal["votes"] * len(preds))
                hallucinated = bool(batch.y[a])
                rows.append({
                    "id": qid, "answer": name, "prob": float(probs[a]), "flagged": bool(flags[a]),
                    "hallucinated": hallucinated, "grounding": GROUNDING_KINDS[kind],
                    "place in list": _bucket(first + 1, (1, 3, 10)), "list length": _bucket(len(preds), (1, 5, 20)),
                    "votes": _bucket(votes, (1, 2)),
                    "graph": "has triples" if len(r.graph) else "empty",
                    "kind": r.extra.get("kind", "?"), "hops": r.extra.get("hops", "?"),
                    "mistake": mistake_kind(r, name, kind != 2) if hallucinated else None,
                    **{f"baseline/{b}": float(scores[a, j]) for j, b in enumerate(baselines) if scores is not None},
                })  # fmt: skip
    return rows, baselines


def summarize(rows: list[dict], key, baselines: list[str] = ()) -> list[dict]:
    from torchmetrics.functional.classification import binary_average_precision

    groups: dict = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    out = []
    for name, group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        pos = [r for r in group if r["hallucinated"]]
        neg = [r for r in group if not r["hallucinated"]]
        y = torch.tensor([r["hallucinated"] for r in group]).long()

        def auc_pr(column: str, y=y, group=group, pos=pos, neg=neg) -> float:
            if not pos or not neg:  # one class only: average precision says nothing
                return float("nan")
            return float(binary_average_precision(torch.tensor([r[column] for r in group]), y))

        tp = sum(r["flagged"] for r in pos)
        fp = sum(r["flagged"] for r in neg)
        f1 = 2 * tp / (2 * tp + fp + len(pos) - tp) if pos else float("nan")
        row = {
            "group": str(name), "nodes": len(group), "hallucinated": len(pos) / len(group),
            "recall": tp / len(pos) if pos else float("nan"), "false_alarms": fp / len(neg) if neg else float("nan"),
            "f1": f1, "auc_pr": auc_pr("prob"),
        }  # fmt: skip
        for b in baselines:
            if all(f"baseline/{b}" in r for r in group):
                row[f"auc_pr/{b}"] = auc_pr(f"baseline/{b}")
        out.append(row)
    return out


def table(title: str, rows: list[dict]) -> str:
    extra = [k for k in (rows[0] if rows else {}) if k.startswith("auc_pr/")]
    head = f"| {title} | answers | hallucinated | recall | false alarms | F1 | AUC-PR |"
    head += "".join(f" AUC-PR {k.split('/', 1)[1]} |" for k in extra)
    lines = [head, "|---|" + "---:|" * (6 + len(extra))]

    def pct(x: float) -> str:
        return "–" if x != x else f"{x:.1%}"  # nan: no answer of that class in the group

    def num(x: float) -> str:
        return "–" if x != x else f"{x:.3f}"

    for r in rows:
        cells = [r["group"], str(r["nodes"]), pct(r["hallucinated"]), pct(r["recall"]), pct(r["false_alarms"]),
                 num(r["f1"]), num(r["auc_pr"]), *(num(r[k]) for k in extra)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/detector.yaml")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--output", default="outputs/detector/misses")
    args, overrides = p.parse_known_args()
    rows, baselines = score_nodes(args.config, args.ckpt, overrides)
    keys = ["grounding", "place in list", "list length", "votes", "graph", "kind", "hops"]
    parts = {
        key: summarize(rows, lambda r, key=key: r[key], baselines)
        for key in keys
        if {r[key] for r in rows} != {"?"}  # the embedded benchmark's fields, absent elsewhere
    }
    parts["kind of mistake (hallucinated answers)"] = summarize([r for r in rows if r["hallucinated"]],
                                                                lambda r: r["mistake"])  # fmt: skip
    text = "\n\n".join(table(title, part) for title, part in parts.items()) + "\n"
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "misses.md").write_text(text)
    (out / "misses.json").write_text(json.dumps({"groups": parts, "nodes": rows}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
