"""``kglightning build-subgraphs``: RoG records with G-Retriever PCST subgraphs, from a user's KG and questions
(its command line is :mod:`~kglightning.retrieval.build_subgraphs_cli`).

Example::

    kglightning build-subgraphs --kg triples.tsv --questions train=q_train.jsonl --questions test=q_test.jsonl \\
        --out data/my_kgqa
    kglightning fit --config configs/detector.yaml --data.init_args.data_dir data/my_kgqa

``--kg embedded`` takes the embedded benchmark's whole KG, and with it ``--questions`` may be left out: the
benchmark's three splits are re-cut with PCST. Each split is written to ``OUT/<split>.jsonl`` with the subgraph
statistics (KG-Guard's Table 13 and the answer recall of its Table 15) in ``OUT/subgraph_stats.json`` and a
per-question time and size list in ``OUT/<split>.times.jsonl``.

On several cores and machines (:mod:`~kglightning.retrieval.prepare`; from the same starting embedding cache, the
records do not depend on either)::

    kglightning build-subgraphs ... --workers 8                # one machine, 8 processes
    kglightning build-subgraphs ... --shard 2/4 --workers 8    # the third of 4 machines (0/4 ... 3/4)
    kglightning build-subgraphs --merge data/my_kgqa           # the 4 machines' files gathered in one folder
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from kglightning.data.kg import KGIndex
from kglightning.data.sources.loaders import read_questions, write_records
from kglightning.data.store.stage_map import shard_bounds, shard_suffix
from kglightning.fileio import atomic_write
from kglightning.retrieval.pcst import PCSTRetriever, SubgraphStats
from kglightning.retrieval.prepare import (
    cut_records,
    embed_texts,
    needed_texts,
    rows_key,
    settings,
    write_stats,
)

__all__ = ["build_subgraphs", "embedded_kg"]

log = logging.getLogger(__name__)


def embedded_kg() -> KGIndex:
    from kglightning.data.sources.embedded import build_knowledge_graph

    kg = build_knowledge_graph()
    return KGIndex.from_triples([kg.triple(i) for i in range(kg.num_triples)])


def build_subgraphs(
    kg: KGIndex,
    questions: dict[str, str],
    out_dir: str | Path,
    retriever: PCSTRetriever,
    limit: int | None = None,
    workers: int = 1,
    shard: tuple[int, int] | None = None,
    embed_only: bool = False,
) -> dict[str, dict]:
    """Cut a PCST subgraph for every question of every split and write the records; returns the stats per split.

    The embeddings of every split are encoded first, in fixed blocks, then the cuts run over ``workers``
    processes, cached and resumable; ``shard=(i, N)`` cuts part ``i`` of ``N`` of each split
    (``<split>.shard-i-of-N.jsonl``, merged by :func:`merge_shards`) and ``embed_only`` stops after the embeddings
    (with ``shard``: its share of them). See :mod:`~kglightning.retrieval.prepare`.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stats: dict[str, dict] = {}
    raw: dict[str, SubgraphStats] = {}
    suffix = "" if shard is None else f".{shard_suffix(*shard)}"
    # a graph already there (e.g. the embedded benchmark) is ignored
    splits = {split: read_questions(path, limit=limit) for split, path in questions.items()}
    # the blocks of phase 1 over every split's strings at once: the same blocks on every machine and for any order
    texts = needed_texts(retriever, [r for records in splits.values() for r in records], kg)
    new = embed_texts(retriever, texts, shard=shard if embed_only else None, progress=retriever.show_progress)
    log.info("%d strings to embed, %d of them new", len(texts), new)
    if embed_only:
        return stats
    key = rows_key(retriever, texts)
    for split, records in splits.items():
        path = questions[split]
        cuts, s = cut_records(retriever, records, kg, workers, desc=f"PCST {split}", key=key, shard=shard)
        out = [r for r in cuts if r is not None]
        write_records(out, out_dir / f"{split}{suffix}.jsonl")
        with atomic_write(out_dir / f"{split}{suffix}.times.jsonl") as f:
            for rec, sec, n, t in zip(out, s.seconds, s.nodes, s.triples, strict=True):
                f.write(json.dumps({"id": rec.id, "seconds": round(sec, 5), "nodes": n, "triples": t}) + "\n")
        stats[split], raw[split] = {"questions_file": str(path), **s.summary()}, s
        if shard is not None:  # the rows of the split this part holds: merge_shards checks that the parts tile it
            stats[split]["part"] = [*shard_bounds(len(records), *shard), len(records)]
    used = {**settings(retriever), "limit": limit}
    write_stats(out_dir / f"subgraph_stats{suffix}.json", used, stats, raw if shard is not None else None)
    return stats
