"""How long a command takes to start: each file subcommand's ``--help``, the top-level ``--help`` and ``cache du`` on
an empty cache, beside ``python -c "import lightning"`` and ``python -c "import torch"``, for this tree and for a
base commit, in one run on one machine (issue 58).

Every command runs in a fresh interpreter, ``--repeats`` times, the trees taking turns within each repeat so that a
slower minute of a shared machine weighs on both alike; the median counts. The base commit's tree is unpacked with
``git archive`` into a temporary folder, and each tree is put first on ``PYTHONPATH``.

    python tools/bench/bench_startup.py --base 6fe801d --repeats 5 --output docs/results/startup.json

The result file is what BENCHMARKS.md and the README show (``tools/docs_numbers.py``, block ``startup``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from record_run import _commit, machine  # noqa: E402
from side_by_side import unpack, write_result  # noqa: E402

FILE_COMMANDS = ("evaluate", "build-benchmark", "build-subgraphs", "conformalize", "select", "import-predictions",
                 "cache")  # fmt: skip
COMMANDS = [["--help"], *([c, "--help"] for c in FILE_COMMANDS), ["cache", "du"]]
IMPORTS = {"import lightning": "import lightning", "import torch": "import torch"}


def _seconds(argv: list[str], tree: Path, cache: Path) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree), KGLIGHTNING_CACHE=str(cache))
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cache.parent, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} (PYTHONPATH={tree}) failed: {done.stderr[-2000:]}")
    return seconds


def measure(base: str, repeats: int) -> dict[str, object]:
    """``{"imports": {name: median s}, "commands": [{"command", "seconds", "base_seconds"}]}``."""
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this": ROOT, "base": unpack(base, Path(tmp) / "base", "kglightning")}
        cache = Path(tmp) / "work" / "cache"  # empty: `cache du` lists nothing
        cache.parent.mkdir()
        times: dict[tuple[str, str], list[float]] = {}
        for r in range(repeats):
            for name, code in IMPORTS.items():
                times.setdefault(("import", name), []).append(_seconds([sys.executable, "-c", code], ROOT, cache))
            for argv in COMMANDS:
                for tree, path in trees.items():
                    cmd = [sys.executable, "-m", "kglightning", *argv]
                    times.setdefault((tree, " ".join(argv)), []).append(_seconds(cmd, path, cache))
            print(f"repeat {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {
        "imports": {name: round(median[("import", name)], 3) for name in IMPORTS},
        "commands": [
            {
                "command": "kglightning " + " ".join(a),
                "seconds": round(median[("this", " ".join(a))], 3),
                "base_seconds": round(median[("base", " ".join(a))], 3),
            }
            for a in COMMANDS
        ],  # fmt: skip
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="6fe801d", help="the commit to compare with")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output", type=Path, default=None, help="the result file (JSON) to write")
    args = p.parse_args(argv)
    result = {"date": date.today().isoformat(), "commit": _commit(), "base": args.base, "repeats": args.repeats,
              "machine": machine(), **measure(args.base, args.repeats)}  # fmt: skip
    lightning = result["imports"]["import lightning"]
    for row in result["commands"]:
        print(f"{row['command']:<40} {row['seconds']:6.2f} s ({row['seconds'] / lightning:5.1%} of import lightning)"
              f"   base {row['base_seconds']:6.2f} s")  # fmt: skip
    print(f"import lightning {lightning:.2f} s, import torch {result['imports']['import torch']:.2f} s")
    write_result(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
