"""Evidence mining benchmark: shortest relation paths per question, ours against networkx, side by side.

On the same questions, in one run:
  * ours: ``EvidenceBuilder.shortest_paths`` (a ``KGIndex`` per question, CSR arrays, one shared BFS and one
    relation-sequence walk per topic entity for all its answers); also ``EvidenceBuilder.mine`` (paths plus
    grounding, Beta-Bernoulli confidence and constraint scoring) and the per-pair ``KGIndex.shortest_relation_paths``;
  * networkx: per question an ``nx.MultiDiGraph`` of the triples (for relation lookup) and its undirected simple
    graph (for the search), ``nx.all_shortest_paths`` for each (topic, answer) pair, each node path expanded to
    relation sequences (``r`` for a triple walked forward, ``~r`` backwards, every parallel relation).
Both mean the same thing: the relation sequences of all shortest topic-answer paths of ≤ ``max_hops`` hops in the
graph walked both ways. The script checks agreement per (question, topic, answer) pair and prints it.

Questions: the embedded benchmark's test split (graphs ≤ 1,000 triples) and seeded synthetic Freebase-like graphs
(5k-20k triples, CVT nodes ``m.N`` and hub entities, topic = a hub, 1-8 answers 1-3 hops away; plus a set of
list questions with 16-48 answers). Times are CPU times of this process (``time.process_time``), the methods
interleaved question by question, so other jobs on a shared machine skew them little; graph construction
(``build``) and search are timed apart.

    python tools/bench/bench_evidence.py [--max-records N] [--sizes 5000,10000,20000] [--synthetic 10]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import platform
import resource
import time
import tracemalloc
from collections.abc import Callable
from datetime import date

import networkx as nx
import numpy as np

from kglightning.data import KGIndex, KGQARecord
from kglightning.data.sources.embedded import ensure_embedded_benchmark
from kglightning.data.sources.loaders import read_records
from kglightning.evidence import EvidenceBuilder

Pairs = dict[tuple[str, str], set[tuple[str, ...]]]


def synthetic_record(n_triples: int, seed: int, answers: tuple[int, int] = (1, 8), n_relations: int = 80) -> KGQARecord:
    """A seeded Freebase-like question graph: Zipf-popular hub entities and CVT nodes ``m.N`` (1 in-edge, 2-4 out).

    About 40% of the triples touch a CVT node. The topic entity is the entity of highest degree (retrieved KGQA
    subgraphs are built around it); ``answers[0]``-``answers[1]`` answers are drawn among the non-CVT entities 1-3
    hops away, a ring chosen uniformly per answer.
    """
    rng = np.random.default_rng(seed)
    n_ent, n_cvt = n_triples // 5, n_triples // 10
    ents = np.array([f"e{i}" for i in range(n_ent)], dtype=object)
    pop = 1.0 / np.arange(1, n_ent + 1) ** 0.9
    rel_p = 1.0 / np.arange(1, n_relations + 1)
    rels = np.array([f"ns.type{i // 8}.rel{i}" for i in range(n_relations)], dtype=object)
    out_deg = rng.integers(2, 5, size=n_cvt)
    cvt = np.array([f"m.{c}" for c in range(n_cvt)], dtype=object)
    n_free = n_triples - n_cvt - int(out_deg.sum())
    draw_ent = rng.choice(n_ent, size=n_cvt + int(out_deg.sum()) + n_free, p=pop / pop.sum())
    draw_rel = rng.choice(n_relations, size=n_triples, p=rel_p / rel_p.sum())
    heads = np.concatenate([ents[draw_ent[:n_cvt]], np.repeat(cvt, out_deg), ents[draw_ent[-n_free:]]])
    tails = np.concatenate([cvt, ents[draw_ent[n_cvt:-n_free]], ents[rng.integers(0, n_ent, size=n_free)]])
    triples = list(zip(heads.tolist(), rels[draw_rel].tolist(), tails.tolist()))
    kg = KGIndex.from_triples(triples)
    topic = max(ents.tolist(), key=lambda e: len(kg.edges(e)))
    rings, seen, frontier = [], {topic}, [topic]
    for _ in range(3):  # BFS rings at distance 1, 2, 3 (walking triples both ways), without CVT nodes
        frontier = sorted({v for u in frontier for v in kg.neighbors(u)} - seen)
        seen.update(frontier)
        rings.append([e for e in frontier if not e.startswith("m.")])
    rings = [r for r in rings if r]
    chosen: set[str] = set()
    for _ in range(int(rng.integers(answers[0], answers[1] + 1))):
        ring = rings[int(rng.integers(0, len(rings)))]
        chosen.add(ring[int(rng.integers(0, len(ring)))])
    gold = sorted(chosen)
    return KGQARecord(f"syn-{n_triples}-{seed}", "synthetic?", gold, [topic], gold, triples)


class Method:
    """One contender: ``build(rec)`` makes its graph structure, ``search(rec, graph)`` mines the paths."""

    def __init__(self, name: str, build: Callable, search: Callable):
        self.name, self.build, self.search = name, build, search
        self.build_s = self.search_s = 0.0

    def __call__(self, rec: KGQARecord):
        t0 = time.process_time()  # CPU time of this process: robust to other jobs sharing the 2 cores
        graph = self.build(rec)
        t1 = time.process_time()
        out = self.search(rec, graph)
        t2 = time.process_time()
        self.build_s += t1 - t0
        self.search_s += t2 - t1
        return out


def methods(max_hops: int) -> list[Method]:
    """Ours (shared search; per-pair search; full mining) and networkx, each with its own state."""
    paths, mine = EvidenceBuilder(max_hops, max_paths=10**9), EvidenceBuilder(max_hops, max_paths=10**9)

    def per_pair(rec: KGQARecord, kg: KGIndex) -> Pairs:
        return {
            (q, a): set(kg.shortest_relation_paths(q, a, max_hops, 10**9))
            for q in dict.fromkeys(rec.q_entity)
            for a in dict.fromkeys(rec.a_entity)
            if q in kg and a in kg and q != a
        }

    return [
        Method("ours", paths.index, lambda rec, kg: {k: set(v) for k, v in paths.shortest_paths(rec).items()}),
        Method("ours per-pair", KGIndex.from_record, per_pair),
        Method("ours mine", mine.index, lambda rec, kg: len(mine.mine(rec))),
        Method("networkx", networkx_graphs, lambda rec, graphs: networkx_paths(rec, graphs, max_hops)),
    ]


def networkx_graphs(rec: KGQARecord) -> tuple[nx.MultiDiGraph, nx.Graph]:
    """The directed multigraph (relation lookup) and its undirected simple graph (the search)."""
    directed = nx.MultiDiGraph()
    directed.add_edges_from((h, t, {"relation": r}) for h, r, t in rec.graph)
    undirected = nx.Graph()
    undirected.add_edges_from((h, t) for h, _, t in rec.graph)
    return directed, undirected


def networkx_paths(rec: KGQARecord, graphs: tuple[nx.MultiDiGraph, nx.Graph], max_hops: int) -> Pairs:
    """The straightforward way: all_shortest_paths per (topic, answer) pair, hops expanded to relation labels."""
    directed, undirected = graphs
    out: Pairs = {}
    for q in dict.fromkeys(rec.q_entity):
        for a in dict.fromkeys(rec.a_entity):
            if q not in undirected or a not in undirected or q == a:
                continue
            found: set[tuple[str, ...]] = set()
            try:
                for nodes in nx.all_shortest_paths(undirected, q, a):
                    if len(nodes) - 1 > max_hops:
                        break
                    hops = []
                    for u, v in zip(nodes, nodes[1:]):
                        fwd = {d["relation"] for d in directed.get_edge_data(u, v, default={}).values()}
                        bwd = {"~" + d["relation"] for d in directed.get_edge_data(v, u, default={}).values()}
                        hops.append(sorted(fwd | bwd))
                    found.update(itertools.product(*hops))
            except nx.NetworkXNoPath:
                pass
            out[(q, a)] = found
    return out


def peak_mib(method: Method, records: list[KGQARecord]) -> float:
    """Peak traced allocation (Python objects and numpy buffers) of one pass, in MiB."""
    gc.collect()
    tracemalloc.start()
    for r in records:
        method(r)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def compare(name: str, records: list[KGQARecord], max_hops: int, memory: bool) -> dict:
    """Run every method on every question, interleaved (rotating order), and check the answers agree."""
    ms = methods(max_hops)
    for m in ms:  # warm-up: imports and lazily built code paths
        m(records[0])
        m.build_s = m.search_s = 0.0
    outs: dict[str, list] = {m.name: [] for m in ms}
    gc.collect()
    for i, rec in enumerate(records):
        for m in ms[i % len(ms) :] + ms[: i % len(ms)]:
            outs[m.name].append(m(rec))
    ours, base = outs["ours"], outs["networkx"]
    assert ours == outs["ours per-pair"], "shared search and per-pair search disagree"
    pairs = [(qo.get(k), qb.get(k)) for qo, qb in zip(ours, base) for k in qo.keys() | qb.keys()]
    n, by = len(records), {m.name: m for m in ms}
    total = {k: m.build_s + m.search_s for k, m in by.items()}
    res = {
        "set": name,
        "questions": n,
        "triples_mean": float(np.mean([len(r.graph) for r in records])),
        "answers_mean": float(np.mean([len(r.a_entity) for r in records])),
        "pairs": len(pairs),
        "relation_paths": sum(len(v) for q in ours for v in q.values()),
        "evidence_mined": sum(outs["ours mine"]),
        **{f"{k} q/s": n / t for k, t in total.items()},
        **{f"{k} build share": by[k].build_s / total[k] for k in ("ours", "networkx")},
        "speedup": total["networkx"] / total["ours"],
        "speedup search only": by["networkx"].search_s / by["ours"].search_s,
        "speedup mine": total["networkx"] / total["ours mine"],
        "pair agreement %": 100.0 * sum(a == b for a, b in pairs) / max(len(pairs), 1),
        "question agreement %": 100.0 * sum(qo == qb for qo, qb in zip(ours, base)) / n,
    }
    if memory:
        for m in methods(max_hops):
            res[f"{m.name} peak MiB"] = peak_mib(m, records)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-records", type=int, default=None, help="embedded test questions (default: all)")
    p.add_argument("--sizes", default="5000,10000,20000", help="synthetic graph sizes in triples")
    p.add_argument("--synthetic", type=int, default=10, help="synthetic questions per size")
    p.add_argument("--list-size", type=int, default=10000, help="graph size of the list-question set (0: skip)")
    p.add_argument("--max-hops", type=int, default=4)
    p.add_argument("--no-memory", action="store_true", help="skip the traced-memory passes")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    sets = [("embedded test", list(read_records(ensure_embedded_benchmark() / "test.jsonl", limit=args.max_records)))]
    for size in (int(s) for s in args.sizes.split(",") if s):
        sets.append((f"synthetic {size // 1000}k", [synthetic_record(size, seed) for seed in range(args.synthetic)]))
    if args.list_size:  # list questions (WebQSP/CWQ have many with tens of answers): 16-48 answers each
        recs = [synthetic_record(args.list_size, 1000 + seed, answers=(16, 48)) for seed in range(args.synthetic)]
        sets.append((f"synthetic {args.list_size // 1000}k, 16-48 answers", recs))
    rows = [compare(name, recs, args.max_hops, not args.no_memory) for name, recs in sets]
    print(f"date {date.today()}  machine {platform.machine()}, {os.cpu_count()} cores  max_hops {args.max_hops}")
    for row in rows:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
