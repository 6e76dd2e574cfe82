"""The main job (``python -m kglightning fit --config configs/detector.yaml``) from an empty cache, for this tree and
for a base commit, one after the other in one run on one machine, with where the time went (issue 58).

Each tree runs in its own empty cache and working folder, with ``PYTHONPATH`` set to it (the base commit unpacked with
``git archive``: its ``kglightning`` and ``configs``). Every line the run prints is stamped as it arrives; the
stages are the spans between the first lines of each kind (start-up until the first line of the data, the benchmark
built, the answers proposed, the encodings and graphs, training, the test).

With ``--repeats N`` each tree runs N times, the two taking turns at going first (this machine's speed drifts by a
fifth within minutes), and each tree's median run is compared.

    python tools/bench/bench_main_job.py --base 6fe801d --repeats 2 --output docs/results/main_job_speed.json
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from record_run import _commit, machine, run_metrics, stages  # noqa: E402
from side_by_side import unpack, write_result  # noqa: E402

KEEP = ("test/f1", "test/auc_pr", "test/precision", "test/recall")


def run_main_job(tree: Path, work: Path) -> dict[str, object]:
    """Wall seconds, seconds per stage, epochs trained and test metrics of the main job run in ``tree``."""
    env = dict(os.environ, PYTHONPATH=str(tree), KGLIGHTNING_CACHE=str(work / "cache"))
    env.pop("OMP_WAIT_POLICY", None)
    cmd = [sys.executable, "-m", "kglightning", "fit", "--config", str(tree / "configs" / "detector.yaml")]
    (work / "run").mkdir(parents=True)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=work / "run", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)  # fmt: skip
    stamped: list[tuple[float, str]] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        stamped.append((time.perf_counter() - start, line))
    wall = time.perf_counter() - start
    if proc.wait() != 0:
        raise SystemExit(f"the main job failed in {tree}:\n{''.join(line for _, line in stamped[-40:])}")
    metrics, epochs = run_metrics(work / "run")
    return {"seconds": round(wall, 1), "stages": stages(stamped, wall), "epochs": epochs,
            "metrics": {k: metrics[k] for k in KEEP if k in metrics}}  # fmt: skip


def _median_run(runs: list[dict[str, object]]) -> dict[str, object]:
    """The run of median wall time (the lower middle one of an even number), with every run's seconds beside it."""
    ordered = sorted(runs, key=lambda r: r["seconds"])
    return {**ordered[(len(ordered) - 1) // 2], "all_seconds": [r["seconds"] for r in runs]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="6fe801d")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of each tree, alternating which goes first; each tree's median run is reported")  # fmt: skip
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    result: dict[str, object] = {"date": date.today().isoformat(), "commit": _commit(), "base": args.base,
                                 "machine": machine(), "repeats": args.repeats}  # fmt: skip
    runs: dict[str, list[dict[str, object]]] = {"this": [], "base_run": []}
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base_tree"
        base_tree.mkdir()
        trees = {"this": ROOT, "base_run": unpack(args.base, base_tree, "kglightning", "configs")}
        for i in range(args.repeats):
            for name in ("this", "base_run") if i % 2 == 0 else ("base_run", "this"):
                runs[name].append(run_main_job(trees[name], Path(tmp) / f"{name}-{i}"))
                print(f"{name} ({args.base if name == 'base_run' else 'this tree'}), run {i + 1}: {runs[name][-1]}",
                      flush=True)  # fmt: skip
    result["this"], result["base_run"] = _median_run(runs["this"]), _median_run(runs["base_run"])
    result["ratio"] = round(result["this"]["seconds"] / result["base_run"]["seconds"], 3)
    print(f"ratio {result['ratio']}")
    write_result(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
