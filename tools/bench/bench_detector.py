"""Detector benchmark: answer-node classifications per second, a training epoch's time, peak memory.

Side by side in one run, on the same graphs (the embedded benchmark's test split, embeddings cached):
  * ours: one forward pass per batch of question graphs scores every proposed answer node at once;
  * baseline: one forward pass per (question, answer node) instance, the straightforward way to run a per-instance
    classifier.
Both produce the same logits (checked), so the ratio is pure throughput.

    python tools/bench/bench_detector.py [--max-records 600] [--device cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from datetime import date

import lightning as L
import torch

from kglightning.data import DetectionDataModule
from kglightning.modules import HallucinationDetector


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@torch.no_grad()
def batched(model, dm, graphs, batch_size, device):
    out = []
    for i in range(0, len(graphs), batch_size):
        out.append(model(dm.collate(graphs[i : i + batch_size]).to(device)).cpu())
    return torch.cat(out)


@torch.no_grad()
def per_node(model, dm, graphs, device):
    out = []
    for g in graphs:
        for k in range(g.answer_index.numel()):
            single = g.clone()
            single.answer_index = g.answer_index[k : k + 1]
            single.y = g.y[k : k + 1]
            single.answer_names = [g.answer_names[k]]
            out.append(model(dm.collate([single]).to(device)).cpu())
    return torch.cat(out)


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-records", type=int, default=600, help="records per split (None = all)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    L.seed_everything(0)
    from kglightning.baselines import EmbeddingPathReasoner

    dm = DetectionDataModule(proposer=EmbeddingPathReasoner(), max_records=args.max_records, batch_size=32)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    graphs = dm.datasets["test"]
    n_nodes = sum(g.answer_index.numel() for g in graphs)
    model = HallucinationDetector(text_dim=dm.text_dim).to(args.device).eval()

    batched(model, dm, graphs[:8], args.batch_size, args.device)  # warm-up
    fast, t_fast = timed(batched, model, dm, graphs, args.batch_size, args.device)
    slow, t_slow = timed(per_node, model, dm, graphs, args.device)
    assert torch.allclose(fast, slow, atol=1e-4), "batched and per-node logits differ"

    model.train()
    trainer = L.Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        accelerator=args.device,
    )
    _, t_epoch = timed(trainer.fit, model, dm)

    results = {
        "date": str(date.today()),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, {args.device}",
        "test_graphs": len(graphs),
        "answer_nodes": n_nodes,
        "batched_nodes_per_s": n_nodes / t_fast,
        "per_node_nodes_per_s": n_nodes / t_slow,
        "speedup": t_slow / t_fast,
        "train_graphs": len(dm.datasets["train"]),
        "train_epoch_s": t_epoch,
        "peak_rss_mib": _peak_rss_mib(),
    }
    if args.device.startswith("cuda"):
        results["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    width = max(map(len, results))
    for key, value in results.items():
        print(f"{key:<{width}}  {value:.2f}" if isinstance(value, float) else f"{key:<{width}}  {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
