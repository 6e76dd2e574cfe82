"""PCST subgraph retrieval against a plain BFS k-hop cut of the same size, side by side in one run.

Per question of the embedded benchmark's test split (or ``--kg``/``--questions`` files): *PCST* is
:class:`~kglightning.retrieval.PCSTRetriever` (the ``hops``-hop neighbourhood of the topic entities, prizes from the
bundled MiniLM, ``pcst_fast``); *BFS* is a breadth-first cut from the same topic entities that stops at the number of
nodes PCST kept (:func:`~kglightning.data.kg_paths.khop_ids` with ``max_nodes``), with the triples among them. Text
embeddings are computed once before timing (both runs read the same cache), so the times are the cut itself. Reports
milliseconds per question (mean and 95th percentile), the size of what each keeps and its answer recall (questions
with a gold answer among the kept nodes).

    PYTHONPATH=. python tools/bench/bench_pcst.py [--questions-limit 500] [--hops 2]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kg", default="embedded", help="'embedded' or a triples file (.tsv/.parquet)")
    p.add_argument("--questions", default=None, help="questions file (default: the embedded test split)")
    p.add_argument("--questions-limit", type=int, default=500)
    p.add_argument("--hops", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    from kglightning.data.embeddings import SentenceEncoder
    from kglightning.data.kg_paths import khop_ids
    from kglightning.data.sources.loaders import read_questions
    from kglightning.data.sources.triples import load_kg
    from kglightning.data.splits import locate_splits
    from kglightning.retrieval.build_subgraphs import embedded_kg
    from kglightning.retrieval.pcst import PCSTRetriever

    kg = embedded_kg() if args.kg == "embedded" else load_kg(args.kg)
    path = args.questions or locate_splits(None)["test"][0]
    questions = [q for q in read_questions(path, limit=args.questions_limit) if any(e in kg for e in q.q_entity)]
    retriever = PCSTRetriever(SentenceEncoder(show_progress=False), hops=args.hops, show_progress=False)
    # warm the embedding cache: every node label, relation text and question the runs will look up
    from kglightning.data.text import relation_text

    retriever.embeddings.add(kg.entities)
    retriever.embeddings.add(relation_text(r) for r in kg.relations)
    retriever.embeddings.add(q.question for q in questions)

    rows, names = [], kg.entities
    for q in questions:
        topics = [e for e in q.q_entity if e in kg]
        golds = {a for a in [*q.a_entity, *q.answer] if a in kg}
        start = time.perf_counter()
        triples, nodes = retriever.retrieve(q.question, topics, kg)
        pcst_s = time.perf_counter() - start
        kept = set(nodes).union(h for h, _, t in triples).union(t for _, _, t in triples)
        start = time.perf_counter()
        ids, _ = khop_ids(kg, topics, args.hops, retriever.max_degree, max(len(kept), 1))
        bfs = kg.subgraph(names[i] for i in ids.tolist())
        bfs_s = time.perf_counter() - start
        rows.append({
            "pcst_s": pcst_s, "bfs_s": bfs_s, "pcst_nodes": len(kept), "bfs_nodes": bfs.num_entities,
            "pcst_triples": len(triples), "bfs_triples": bfs.num_edges,
            "pcst_hit": bool(golds & kept), "bfs_hit": bool(golds & set(bfs.entities)), "has_gold": bool(golds),
        })  # fmt: skip

    def col(key: str) -> np.ndarray:
        return np.array([r[key] for r in rows], dtype=float)

    gold = col("has_gold").astype(bool)
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}, {args.threads} threads, "
          f"{len(rows)} questions, {args.hops}-hop neighbourhoods of {kg}")  # fmt: skip
    print("| cut | ms/question (mean) | ms/question (p95) | avg nodes | avg triples | answer recall |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in ("pcst", "bfs"):
        s = col(f"{name}_s") * 1000
        print(f"| {name.upper()} | {s.mean():.1f} | {np.percentile(s, 95):.1f} | {col(f'{name}_nodes').mean():.1f} | "
              f"{col(f'{name}_triples').mean():.1f} | {100 * col(f'{name}_hit')[gold].mean():.1f}% |")  # fmt: skip
    print(f"PCST / BFS time: {col('pcst_s').sum() / col('bfs_s').sum():.1f}x")


if __name__ == "__main__":
    main()
