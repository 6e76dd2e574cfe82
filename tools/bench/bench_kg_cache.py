"""The KG index cache of ``load_kg``: the Arrow file against the pickle it replaced, side by side in one run.

Builds a random KG (``--entities`` names, ``--relations`` relations, ``--triples`` triples; seeded), indexes it,
then times writing and reading the index both ways in the same process: the Arrow file that
:func:`~kglightning.data.sources.triples.load_kg` keeps (names and id triples; the adjacency arrays rebuilt on read)
and a pickle of the whole index (what the cache held before, and what it no longer reads: unpickling runs code).
Reading checks that both give the index's digest back.

    PYTHONPATH=. python tools/bench/bench_kg_cache.py [--triples 2000000]
"""

from __future__ import annotations

import argparse
import pickle
import platform
import random
import tempfile
import time
from datetime import date
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--entities", type=int, default=300_000)
    p.add_argument("--relations", type=int, default=2_000)
    p.add_argument("--triples", type=int, default=2_000_000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    from kglightning.data.kg import KGIndex
    from kglightning.data.sources.triples import _read_index, _write_index

    rng = random.Random(args.seed)
    triples = [(f"m.{rng.randrange(args.entities)}", f"rel.{rng.randrange(args.relations)}",
                f"m.{rng.randrange(args.entities)}") for _ in range(args.triples)]  # fmt: skip
    start = time.perf_counter()
    kg = KGIndex.from_triples(triples)
    build = time.perf_counter() - start
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        arrow, pkl = Path(tmp) / "index.arrow", Path(tmp) / "index.pkl"
        start = time.perf_counter()
        _write_index(kg, arrow)
        rows.append(("Arrow file (now)", time.perf_counter() - start, arrow))
        start = time.perf_counter()
        with open(pkl, "wb") as f:
            pickle.dump(kg, f, protocol=pickle.HIGHEST_PROTOCOL)
        rows.append(("pickle (before)", time.perf_counter() - start, pkl))
        reads = []
        for _, _, path in rows:
            start = time.perf_counter()
            if path.suffix == ".arrow":
                again = _read_index(path)
            else:
                with open(path, "rb") as f:
                    again = pickle.load(f)
            reads.append(time.perf_counter() - start)
            assert again.digest() == kg.digest(), path
        print(f"{date.today()}, {platform.machine()}, {kg}: indexed from string triples in {build:.2f} s")
        print("| cache file | MB | write s | read s |\n|---|---:|---:|---:|")
        for (name, write, path), read in zip(rows, reads):
            print(f"| {name} | {path.stat().st_size / 2**20:.0f} | {write:.2f} | {read:.2f} |")


if __name__ == "__main__":
    main()
