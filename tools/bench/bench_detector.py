"""Detector benchmark: answer-node classifications per second, training step time, peak memory.

Side by side in one run, on the same graphs (the embedded benchmark, embeddings cached) and the same weights:
  * ours: one forward pass per batch of question graphs; edge features projected once per (relation, kind) type
    (``kglightning.nn.conv``), and each layer run only on the nodes and edges that the answer nodes' final states
    depend on (``kglightning.nn.receptive``);
  * whole graph: the same batches, every edge's features projected and every node's state computed (the detector
    as it ran before this benchmark's first entry);
  * per-node loop: one forward pass per (question, answer node) instance, the straightforward way to run a
    per-instance classifier (on the first ``--loop-records`` graphs).
All three give the same logits (checked), so the ratios are pure throughput. Training compares one optimizer step of
ours and of the whole-graph path on the same batches.

    python tools/bench/bench_detector.py [--max-records 600] [--hidden 256] [--device cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time
from datetime import date
from functools import partial

import lightning as L
import torch
from torch.nn import functional as F

from kglightning.datamodules import DetectionDataModule
from kglightning.modules import HallucinationDetector
from kglightning.nn import GraphTransformerEncoder
from kglightning.nn.kgguard import EDGE_VIRTUAL


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def whole_graph_logits(model: HallucinationDetector, batch) -> torch.Tensor:
    """The detector's logits computed the way it did before: per-edge features, every node's state."""
    net = model.net
    x = torch.cat(
        [batch.x_text, net.topic_mark(batch.topic_mask.long()), net.answer_mark(batch.answer_mask.long())], dim=-1
    )
    edge_text = batch.type_text_emb[batch.edge_type]
    kind = batch.type_kind[batch.edge_type]
    edge_attr = edge_text * (kind != EDGE_VIRTUAL).unsqueeze(-1).to(edge_text.dtype) + net.edge_kind(kind)
    h = net.encoder(x, batch.edge_index, edge_attr)
    return net.head(torch.cat([h[batch.answer_index], batch.question], dim=-1)).squeeze(-1)


@torch.no_grad()
def run_batches(fn, batches) -> torch.Tensor:
    return torch.cat([fn(b).cpu() for b in batches])


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


def train_steps(model, batches, logits) -> float:
    """Seconds per optimizer step over ``batches`` (one warm-up step first)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(b):
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(logits(b), b.y).backward()
        opt.step()

    step(batches[0])
    start = time.perf_counter()
    for b in batches:
        step(b)
    return (time.perf_counter() - start) / len(batches)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-records", type=int, default=600, help="test graphs scored (and train graphs read)")
    p.add_argument("--loop-records", type=int, default=200, help="graphs scored by the per-node loop")
    p.add_argument("--batch-size", type=int, default=64, help="graphs per inference batch")
    p.add_argument("--train-batches", type=int, default=20, help="training steps timed per path (batch 32)")
    p.add_argument("--hidden", type=int, default=256, help="hidden size (256: the paper's; 128: configs/detector.yaml)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    L.seed_everything(0)
    from kglightning.baselines import EmbeddingPathReasoner

    proposer = EmbeddingPathReasoner(max_hops=2, top_k_paths=3, min_relative_prob=0.5, max_answers=10)
    dm = DetectionDataModule(proposer=proposer, max_records=args.max_records, batch_size=32)
    dm.prepare_data()
    dm.setup("fit")
    dm.setup("test")
    graphs = dm.datasets["test"]
    n_nodes = sum(g.answer_index.numel() for g in graphs)
    encoder = partial(GraphTransformerEncoder, hidden_channels=args.hidden, num_layers=2, heads=8)
    model = HallucinationDetector(text_dim=dm.text_dim, encoder=encoder, mlp_hidden=args.hidden).to(args.device).eval()
    batches = [
        dm.collate(graphs[i : i + args.batch_size]).to(args.device) for i in range(0, len(graphs), args.batch_size)
    ]

    ours_fn, whole_fn = model, partial(whole_graph_logits, model)
    run_batches(ours_fn, batches[:1]), run_batches(whole_fn, batches[:1])  # warm-up
    fast, t_fast = timed(run_batches, ours_fn, batches)
    whole, t_whole = timed(run_batches, whole_fn, batches)
    loop_graphs = graphs[: args.loop_records]
    n_loop = sum(g.answer_index.numel() for g in loop_graphs)
    slow, t_slow = timed(per_node, model, dm, loop_graphs, args.device)
    torch.testing.assert_close(fast, whole, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fast[:n_loop], slow, atol=1e-4, rtol=1e-4)

    model.train()
    train = [b.to(args.device) for b, _ in zip(dm.train_dataloader(), range(args.train_batches))]
    t_step_ours = train_steps(model, train, model)
    t_step_whole = train_steps(model, train, whole_fn)
    steps_per_epoch = len(dm.train_dataloader())

    results = {
        "date": str(date.today()),
        "machine": f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, {args.device}",
        "hidden": args.hidden,
        "test_graphs": len(graphs),
        "answer_nodes": n_nodes,
        "ours_nodes_per_s": n_nodes / t_fast,
        "whole_graph_nodes_per_s": n_nodes / t_whole,
        "per_node_loop_nodes_per_s": n_loop / t_slow,
        "speedup_vs_whole_graph": t_whole / t_fast,
        "speedup_vs_per_node_loop": (t_slow / n_loop) / (t_fast / n_nodes),
        "train_step_ours_ms": 1000 * t_step_ours,
        "train_step_whole_graph_ms": 1000 * t_step_whole,
        "train_speedup": t_step_whole / t_step_ours,
        "train_steps_per_epoch": steps_per_epoch,
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
