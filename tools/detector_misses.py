"""What a trained hallucination detector catches and misses, by question kind, gold hop count and kind of mistake.

Loads a config's DetectionDataModule and a checkpoint, scores every test answer node, and groups them:

* by the question's ``kind`` and gold ``hops`` (fields of the embedded benchmark's records; ``?`` when absent);
* hallucinated nodes by kind of mistake, read from the subgraph: ``answer not in subgraph`` (no gold answer in the
  question's graph), ``unreachable`` (no path from a topic entity within 4 hops), ``shorter path``, ``longer path``
  or ``same length, other relations`` than the gold path (the shortest path from a topic entity to the node, against
  the gold ``hops`` and ``relation_path``).

For each group: answer nodes, the share hallucinated, recall (hallucinated nodes flagged), false alarms (faithful
nodes flagged) and F1. Writes ``misses.md`` and ``misses.json`` to ``--output``.

    PYTHONPATH=. python tools/detector_misses.py --config configs/detector.yaml \\
        --ckpt outputs/detector/graph_transformer/checkpoints/best.ckpt --output outputs/detector/misses
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import torch


def mistake_kind(record, name: str) -> str:
    """How a hallucinated answer node went wrong, read from the subgraph (see the module docstring)."""
    from kglightning.datamodules.detection_graphs import answer_paths

    extra = record.extra
    if extra.get("answer_in_graph") is False:
        return "answer not in subgraph"
    ((hops, texts),) = answer_paths(record, [name], max_hops=4)
    if hops is None:
        return "unreachable"
    gold = extra.get("hops")
    if gold is None:
        return "?"
    if hops != gold:
        return "shorter path" if hops < gold else "longer path"
    return "same length, other relations"


def score_nodes(config: str, ckpt: str, overrides: list[str]) -> list[dict]:
    from lightning.pytorch import LightningDataModule, LightningModule

    from kglightning.cli import KGLightningCLI
    from kglightning.datamodules.detection_graphs import answer_owner
    from kglightning.modules import HallucinationDetector

    cli = KGLightningCLI(LightningModule, LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                         run=False, args=["--config", config, *overrides])  # fmt: skip
    dm = cli.datamodule
    dm.prepare_data()
    dm.setup("test")
    model = cli.model  # built from the config, so its encoder matches the checkpoint's
    if not isinstance(model, HallucinationDetector):
        raise TypeError(f"{config} does not configure a HallucinationDetector")
    model.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"])
    model.eval()
    records = {r.id: r for r in dm.records("test")}
    rows = []
    with torch.no_grad():
        for batch in dm.test_dataloader():
            probs = torch.sigmoid(model(batch))
            owner = answer_owner(batch)
            ys = batch.y
            for g, (qid, names) in enumerate(zip(batch.qid, batch.answer_names)):
                mask = owner == g
                for name, p, y in zip(names, probs[mask].tolist(), ys[mask].tolist()):
                    r = records[qid]
                    rows.append({
                        "id": qid, "answer": name, "prob": p, "flagged": p >= float(model.threshold),
                        "hallucinated": bool(y), "kind": r.extra.get("kind", "?"), "hops": r.extra.get("hops", "?"),
                        "mistake": mistake_kind(r, name) if y else None,
                    })  # fmt: skip
    return rows


def summarize(rows: list[dict], key) -> list[dict]:
    groups: dict = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    out = []
    for name, group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        pos = [r for r in group if r["hallucinated"]]
        neg = [r for r in group if not r["hallucinated"]]
        tp = sum(r["flagged"] for r in pos)
        fp = sum(r["flagged"] for r in neg)
        f1 = 2 * tp / (2 * tp + fp + len(pos) - tp) if pos else float("nan")
        out.append({
            "group": str(name), "nodes": len(group), "hallucinated": len(pos) / len(group),
            "recall": tp / len(pos) if pos else float("nan"), "false_alarms": fp / len(neg) if neg else float("nan"),
            "f1": f1,
        })  # fmt: skip
    return out


def table(title: str, rows: list[dict]) -> str:
    lines = [f"| {title} | nodes | hallucinated | recall | false alarms | F1 |", "|---|---:|---:|---:|---:|---:|"]

    def pct(x: float) -> str:
        return "–" if x != x else f"{x:.1%}"  # nan: no node of that class in the group

    for r in rows:
        f1 = "–" if r["f1"] != r["f1"] else f"{r['f1']:.3f}"
        lines.append(f"| {r['group']} | {r['nodes']} | {pct(r['hallucinated'])} | {pct(r['recall'])} | "
                     f"{pct(r['false_alarms'])} | {f1} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="configs/detector.yaml")
    p.add_argument("--ckpt", required=True)
    p.add_argument("--output", default="outputs/detector/misses")
    args, overrides = p.parse_known_args()
    rows = score_nodes(args.config, args.ckpt, overrides)
    parts = {
        "question kind": summarize(rows, lambda r: r["kind"]),
        "gold hops": summarize(rows, lambda r: r["hops"]),
        "kind of mistake (hallucinated nodes)": summarize(
            [r for r in rows if r["hallucinated"]], lambda r: r["mistake"]
        ),  # fmt: skip
    }
    text = "\n\n".join(table(title, part) for title, part in parts.items()) + "\n"
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "misses.md").write_text(text)
    (out / "misses.json").write_text(json.dumps({"groups": parts, "nodes": rows}, indent=1))
    print(text)


if __name__ == "__main__":
    main()
