"""Evidence mining, detector graph building and PCST cuts on 1 and more forked processes, side by side in one run:
seconds, questions per second, speed-up, and whether the output is identical.

Each stage runs exactly what their DataModules run per chunk of questions, through
:func:`~kglightning.data.store.stage_map.cached_map`, with nothing stored (``folder=None``):

* ``evidence``: :class:`~kglightning.datamodules.ProxySFTDataModule`'s mining (``mine_workers``): ``mine_row`` per
  question (:class:`~kglightning.evidence.EvidenceBuilder` with the paper's settings), ``MINE_CHUNK`` questions a
  call; the output is the JSON rows the DataModule caches.
* ``detector``: :class:`~kglightning.datamodules.DetectionDataModule`'s graph building (``build_workers``): one
  graph row per question (:mod:`~kglightning.datamodules.graph_rows`), ``BUILD_CHUNK`` questions a piece, then the
  compact graphs read from the rows over a warm embedding cache (the texts are encoded once beforehand, untimed, by
  ``bench_scale.py``'s hashing encoder); the output is the graphs (by value) and counts.
* ``pcst``: the PCST cuts of ``build-subgraphs`` and of a DataModule's ``subgraphs``
  (:func:`~kglightning.retrieval.prepare.cut_records`, ``workers``), each question cut from its own graph over a
  warm cache; the output is the cut records and their counts (not the per-cut timings they also hold).

The speed-up is against the first ``--workers`` value (1 by default). Records come from a RoG-format file (e.g. ``rog_generator.py --questions 300 --triples 4000``), read once.

    PYTHONPATH=.:tools/bench python tools/bench/bench_workers.py --data /tmp/scale/t300.jsonl --workers 1 2
"""

from __future__ import annotations

import argparse
import hashlib
import os
import pickle
import platform
import tempfile
import time
from datetime import date
from pathlib import Path

STAGES = ("evidence", "detector", "pcst")


def _evidence(records, workers: int) -> tuple[float, str]:
    import datasets

    from kglightning.data.store.stage_map import cached_map
    from kglightning.datamodules.sft import MINE_CHUNK, _mine_batch
    from kglightning.evidence import EvidenceBuilder

    questions = datasets.Dataset.from_dict({"index": list(range(len(records)))})
    features = datasets.Features({"row": datasets.Value("large_string")})
    digest = hashlib.sha1()
    t0 = time.perf_counter()  # mapped in memory (kept nowhere), as ProxySFTDataModule.rows does on its first run
    out = cached_map(questions, _mine_batch, features, None, state=(records, EvidenceBuilder(), 5), workers=workers,
                     batch_size=MINE_CHUNK, progress=False)  # fmt: skip
    for text in out["row"]:
        digest.update((text + "\n").encode())
    return time.perf_counter() - t0, digest.hexdigest()[:12]


def _no_grounder(record):
    return None  # DetectionDataModule without near_miss grounding (the default)


def _text_rows(records, cache_dir: Path):
    """The detector's text -> row map over a warm cache, made once for every ``--workers`` value: a cache opened again
    after new strings were encoded may number its rows otherwise (rows follow the shards' order by name)."""
    from bench_scale import HashEncoder

    from kglightning.data.embeddings import EmbeddingCache
    from kglightning.datamodules.detection_graphs import node_texts

    cache = EmbeddingCache(HashEncoder(), cache_dir)
    cache.add({t for r in records for t in node_texts(r)})  # warm: encoded once, before any timing
    return cache._index


def _detector(records, workers: int, text_id) -> tuple[float, str]:
    import datasets
    import torch

    from kglightning.data.store.stage_map import cached_map
    from kglightning.datamodules.detection import BUILD_CHUNK
    from kglightning.datamodules.graph_rows import build_graph_rows, graph_features, graphs_from_rows, row_stats

    digest = hashlib.sha1()
    t0 = time.perf_counter()
    questions = datasets.Dataset.from_dict({"index": list(range(len(records)))})
    state = (records, True, "keep", _no_grounder, "readable")
    rows = cached_map(questions, build_graph_rows, graph_features(), None, state=state, workers=workers,
                      piece=BUILD_CHUNK, progress=False)  # fmt: skip
    for i, g in graphs_from_rows(rows, text_id):
        digest.update(f"{i}".encode())
        for key in sorted(g.keys()):  # by value: a tensor's pickle also holds its storage's layout
            v = g[key]
            v = (v.dtype, tuple(v.shape), v.contiguous().numpy().tobytes()) if torch.is_tensor(v) else v
            digest.update(pickle.dumps((key, v), protocol=5))
    stats = row_stats(rows)
    seconds = time.perf_counter() - t0
    digest.update(repr(sorted(vars(stats).items())).encode())
    return seconds, digest.hexdigest()[:12]


def _pcst(records, workers: int, cache_dir: Path) -> tuple[float, str]:
    from bench_scale import HashEncoder

    from kglightning.datamodules.detection_graphs import node_texts
    from kglightning.retrieval.pcst import PCSTRetriever
    from kglightning.retrieval.prepare import cut_records

    retriever = PCSTRetriever(HashEncoder(), cache_dir=str(cache_dir), show_progress=False)
    # warm: every string the cuts embed (nodes, relations, questions), encoded before any timing
    retriever.embeddings.add({t for r in records for t in (*node_texts(r), r.question)})
    t0 = time.perf_counter()
    cuts, stats = cut_records(retriever, records, None, workers)  # each question cut from its own graph
    seconds = time.perf_counter() - t0
    digest = hashlib.sha1()
    for r in cuts:
        digest.update(repr(None if r is None else (r.id, list(r.graph))).encode())
    counts = {k: v for k, v in vars(stats).items() if k != "seconds"}  # the cuts' own timings differ run to run
    digest.update(repr(sorted(counts.items())).encode())
    return seconds, digest.hexdigest()[:12]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, required=True, help="a RoG-format jsonl")
    p.add_argument("--limit", type=int, default=None, help="first N questions")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    p.add_argument("--cache", type=Path, default=None, help="embedding cache folder (default: a temporary one)")
    args = p.parse_args()
    import torch

    from kglightning.data.sources.loaders import read_records

    records = read_records(args.data, limit=args.limit, report=False)
    triples = sum(len(r.graph) for r in records)
    cache = args.cache or Path(tempfile.mkdtemp(prefix="bench_workers_"))
    print(f"# {date.today()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}; {len(records)} questions, {triples:,} triples ({args.data.name})\n")  # fmt: skip
    print(f"| stage | workers | questions | seconds | questions/s | speed-up vs {args.workers[0]} | output sha1 |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for stage in args.stages:
        first = None
        text_id = _text_rows(records, cache) if stage == "detector" else None
        for w in args.workers:
            if stage == "evidence":
                seconds, digest = _evidence(records, w)
            elif stage == "detector":
                seconds, digest = _detector(records, w, text_id)
            else:
                seconds, digest = _pcst(records, w, cache)
            first = first or seconds
            print(f"| {stage} | {w} | {len(records)} | {seconds:.1f} | {len(records) / seconds:.1f} | "
                  f"{first / seconds:.2f}x | `{digest}` |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
