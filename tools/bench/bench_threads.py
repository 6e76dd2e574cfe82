"""Two torch jobs on the same cores: fits of the main job's detector alone and two at once, under torch's own thread
policy (a thread per core, idle threads spinning long), under kglightning's (:mod:`kglightning.threads`: the CPUs the
process may use, idle threads sleeping at once), with a brief spin, and with one thread, in one run on one machine
(issue 58).

Each fit is ``python -m kglightning fit --config configs/detector.yaml`` on a warm cache (a first, untimed fit fills
it), for ``--epochs`` epochs with no validation, checkpoint or logger, so that the time is training; a pair starts
two such fits at once. What counts is each fit's wall time, and its training time (Lightning's simple profiler,
``run_training_epoch``), which leaves out the start-up and data loading that a short fit is mostly made of.

    python tools/bench/bench_threads.py --epochs 1 --output docs/results/threads.json
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from record_run import _commit, machine  # noqa: E402
from side_by_side import write_result  # noqa: E402

#: the policies compared: the environment each fit runs with (libgomp reads GOMP_SPINCOUNT before OMP_WAIT_POLICY;
#: 300000 is its default, what torch runs with when nothing is set)
POLICIES = {
    "torch's default (a thread per core, idle threads spin 300,000 times)": {
        "GOMP_SPINCOUNT": "300000", "KGLIGHTNING_THREADS": str(os.cpu_count() or 1)},
    "kglightning's default: idle threads sleep at once (OMP_WAIT_POLICY=PASSIVE)": {},
    "idle threads spin 10,000 times, then sleep (GOMP_SPINCOUNT=10000)": {"GOMP_SPINCOUNT": "10000"},
    "one thread (KGLIGHTNING_THREADS=1)": {"KGLIGHTNING_THREADS": "1"},
}  # fmt: skip
#: the training time in Lightning's simple profiler's table (``run_training_epoch``: mean, calls, total seconds)
TRAINING = re.compile(r"\|\s*run_training_epoch\s*\|\s*[\d.e-]+\s*\|\s*\d+\s*\|\s*([\d.e-]+)\s*\|")


def _fit_command(epochs: int, steps: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "kglightning", "fit", "--config", "configs/detector.yaml", "--trainer.max_epochs",
           str(epochs), "--trainer.limit_val_batches", "0", "--trainer.logger", "false", "--trainer.callbacks", "[]",
           "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false", "--test_after_fit",
           "false", "--trainer.profiler", "simple"]  # fmt: skip
    if steps:
        cmd += ["--trainer.limit_train_batches", str(steps)]
    return cmd


def _start(cmd: list[str], extra: dict[str, str]) -> tuple[subprocess.Popen, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    env.update(extra)
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), \
        time.perf_counter()  # fmt: skip


def _finish(proc: subprocess.Popen, start: float) -> tuple[float, float]:
    """The fit's wall seconds and its training seconds (the profiler's, start-up and data loading left out)."""
    out, _ = proc.communicate()
    wall = round(time.perf_counter() - start, 1)
    if proc.returncode != 0:
        raise SystemExit(f"a fit failed:\n{out[-3000:]}")
    found = TRAINING.search(out)
    if found is None:
        raise SystemExit(f"no training time in the fit's output:\n{out[-3000:]}")
    return wall, round(float(found.group(1)), 1)


def run(cmd: list[str], extra: dict[str, str], together: int) -> list[tuple[float, float]]:
    """The wall and training seconds of ``together`` fits started at once."""
    started = [_start(cmd, extra) for _ in range(together)]
    return [_finish(p, t) for p, t in started]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="at most this many training steps an epoch")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args(argv)
    cmd = _fit_command(args.epochs, args.steps)
    run(_fit_command(1, 5), {}, 1)  # fills the cache: the benchmark, the answers, the encodings
    rows = []
    for name, extra in POLICIES.items():
        (alone, alone_train), pair = run(cmd, extra, 1)[0], run(cmd, extra, 2)
        rows.append({"policy": name, "env": extra, "alone_seconds": alone, "alone_training_seconds": alone_train,
                     "pair_seconds": [w for w, _ in pair], "pair_training_seconds": [t for _, t in pair],
                     "slowdown": round(max(w for w, _ in pair) / alone, 2),
                     "training_slowdown": round(max(t for _, t in pair) / alone_train, 2)})  # fmt: skip
        print(f"{name}: alone {alone:.1f} s ({alone_train:.1f} s training), two at once {pair} "
              f"({rows[-1]['slowdown']:.2f}x, training {rows[-1]['training_slowdown']:.2f}x)", flush=True)  # fmt: skip
    result = {"date": date.today().isoformat(), "commit": _commit(), "machine": machine(), "command": " ".join(cmd[1:]),
              "rows": rows}  # fmt: skip
    write_result(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
