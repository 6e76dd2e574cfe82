"""A data module's first and later setup, side by side for this tree and ``--baseline`` checkouts in one run.

Each measurement is a fresh process that builds the ``data`` of ``--config`` (default the main job's,
``configs/detector.yaml``) and times its ``prepare_data()`` and ``setup("fit")`` with a shared cache
(``--cache``). A *first* run removes the cache's stored detection graphs before (what a first run builds), a *later*
run reads them. A warm-up run of each tree fills the rest of the cache (proposals, embeddings) outside the timing.
The trees take turns ``--repeats`` times, so that a slow moment of the machine falls on both.

    python tools/bench/bench_datamodule_setup.py --baseline /tmp/base09 /tmp/baseabc --repeats 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

_CHILD = """
import os, shutil, sys, time
from pathlib import Path
from kglightning.cli import configured
config, first = sys.argv[1], sys.argv[2] == "first"
if first:
    shutil.rmtree(Path(os.environ["KGLIGHTNING_CACHE"]) / "detection_graphs", ignore_errors=True)
sys.argv = ["bench", "--config", config]
dm = configured("fit").datamodule
t0 = time.perf_counter()
dm.prepare_data()
dm.setup("fit")
print("SECONDS", time.perf_counter() - t0)
"""


def _run(tree: Path, config: Path, cache: Path, kind: str) -> float:
    env = dict(os.environ, KGLIGHTNING_CACHE=str(cache), PYTHONPATH=str(tree), OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", _CHILD, str(config), kind], cwd=tree, env=env, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("SECONDS")))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", type=Path, nargs="*", default=[], help="checkouts of the code to compare with")
    p.add_argument("--config", type=Path, default=Path("configs/detector.yaml"))
    p.add_argument("--cache", type=Path, default=Path("/tmp/kglightning-setup-bench"))
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    trees = {"current": Path.cwd()} | {str(b): b.resolve() for b in args.baseline}
    config = args.config.resolve()
    times: dict[tuple[str, str], list[float]] = {}
    for tree in trees.values():
        _run(tree, config, args.cache, "first")  # warm-up: proposals and embeddings cached
    for _ in range(args.repeats):
        for name, tree in trees.items():
            for kind in ("first", "later"):
                times.setdefault((name, kind), []).append(_run(tree, config, args.cache, kind))
    print("| tree | first run s | later run s |\n|---|---:|---:|")
    for name in trees:
        first, later = (", ".join(f"{t:.1f}" for t in times[name, k]) for k in ("first", "later"))
        print(f"| {name} | {first} | {later} |")


if __name__ == "__main__":
    main()
