"""PCST preparation on 1 and more processes, side by side in one run: seconds, questions/s, and whether the records
are byte-identical.

``build_subgraphs`` (the ``build-subgraphs`` command) re-cuts the embedded benchmark's splits (or ``--kg`` with
``--questions``) from its whole KG once per ``--workers`` value. The embeddings are encoded once, untimed, in a
warm-up run; every timed run reads the same embedding cache, so the times are the cuts (phase 2 of
:mod:`kglightning.retrieval.prepare`) plus reading the questions and finding the blocks (phase 1 with nothing left
to encode). Each ``--workers`` value cuts into a cache of cuts of its own (``KGLIGHTNING_CACHE``); a last run
repeats the first one's command on its cache, so its cuts are read back (what a rerun or a resumed run costs).

    PYTHONPATH=. python tools/bench/bench_prepare.py --workers 1 2 [--limit 2000]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import tempfile
import time
from datetime import date
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kg", default="embedded", help="'embedded' or a triples file (.tsv/.parquet)")
    p.add_argument("--questions", action="append", help="[SPLIT=]FILE (default: the embedded benchmark's splits)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--limit", type=int, default=None, help="questions per split")
    p.add_argument("--work", type=Path, default=None)
    args = p.parse_args()
    import torch

    from kglightning.data.embeddings import SentenceEncoder
    from kglightning.data.sources.triples import load_kg
    from kglightning.retrieval.build_subgraphs import build_subgraphs, embedded_kg
    from kglightning.retrieval.build_subgraphs_cli import _question_files
    from kglightning.retrieval.pcst import PCSTRetriever

    work = args.work or Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    questions = _question_files(args.questions, args.kg, p)
    kg = embedded_kg() if args.kg == "embedded" else load_kg(args.kg)

    def retriever() -> PCSTRetriever:
        return PCSTRetriever(SentenceEncoder(show_progress=False), cache_dir=str(work / "emb"), show_progress=False)

    before = os.environ.get("KGLIGHTNING_CACHE")
    os.environ["KGLIGHTNING_CACHE"] = str(work / "cache-warm")  # the warm-up's cuts: not the user's cache
    build_subgraphs(kg, questions, work / "warm", retriever(), limit=args.limit)  # encodes; untimed
    rows = []
    for n in [*args.workers, "cached"]:  # the last: the first run's command again, its cuts read from the cache
        os.environ["KGLIGHTNING_CACHE"] = str(work / f"cache-w{args.workers[0] if n == 'cached' else n}")
        out = work / f"w{n}"
        n = args.workers[0] if n == "cached" else n  # noqa: PLW2901
        t0 = time.perf_counter()
        stats = build_subgraphs(kg, questions, out, retriever(), limit=args.limit, workers=n)
        seconds = time.perf_counter() - t0
        digest = hashlib.sha1(b"".join((out / f"{s}.jsonl").read_bytes() for s in stats)).hexdigest()[:12]
        rows.append((n, sum(s["questions"] for s in stats.values()), seconds, digest))
    if before is None:
        os.environ.pop("KGLIGHTNING_CACHE", None)
    else:
        os.environ["KGLIGHTNING_CACHE"] = before
    print(f"\n{date.today()}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, KG {args.kg}: {kg}\n")  # fmt: skip
    print("| workers | questions | seconds | questions/s | speed-up | records sha1 |")
    print("|---:|---:|---:|---:|---:|---|")
    base = rows[0][2]
    for i, (n, q, s, d) in enumerate(rows):
        label = f"{n}, cuts read from the cache" if i == len(rows) - 1 else n
        print(f"| {label} | {q:,} | {s:.1f} | {q / s:.1f} | {base / s:.2f}x | `{d}` |")
    print("\nbyte-identical across workers:", len({r[3] for r in rows}) == 1)


if __name__ == "__main__":
    main()
