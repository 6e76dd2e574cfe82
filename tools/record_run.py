"""Run the README's commands as a newcomer would and write what they measured to a result file, the one source of
the numbers that README.md and the docs show (``tools/docs_numbers.py`` renders them from it).

    python tools/record_run.py fit --config configs/detector.yaml --install --rerun --output docs/results/main_job.json
    python tools/record_run.py fit --config configs/detector_gat.yaml --output docs/results/detector_gat.json
    python tools/record_run.py fit --config configs/detector.yaml --misses --output docs/results/detector_misses.json
    python tools/record_run.py tests --output docs/results/test_suite.json
    python tools/record_run.py tutorial docs/tutorials/conformal-sets.md --output docs/results/tutorial_conformal_sets.json
    python tools/record_run.py predict --config configs/sgic.yaml --keep outputs/sgic/test/sgic_summary.json \
        --output docs/results/sgic.json
    python tools/record_run.py predict --config configs/uag.yaml --fit-first configs/relation_scorer.yaml \
        --keep outputs/uag/test/metrics.json outputs/uag/test/sweep.json --output docs/results/uag.json

``fit`` starts from an empty kglightning cache (a temporary ``KGLIGHTNING_CACHE``) in a temporary working folder,
so it builds the benchmark, the proposals and the text encodings as a fresh clone's first run does and leaves the
repository's ``outputs/`` alone. ``--install`` first times ``bash tools/install.sh`` (this tool needs torch, so that is
the time of a re-install, not of a fresh one). The result file holds the command, the date, the commit, the machine,
the config's seed, epochs and width, the epochs trained, the wall-clock seconds, every ``test/*`` metric of the
run's CSV log, and each split's counts from the data module's summary line; the CSV log itself is copied beside it
(``<output>.metrics.csv``). ``--rerun`` runs it a second time on the cache the first filled and records that time
and whether the test metrics came out the same to the last digit.

``--misses`` then runs ``tools/detector_misses.py`` on the checkpoint the run wrote, and keeps its groups (the
answers, the share hallucinated, recall and false alarms per question kind, hop count and kind of mistake) under
``misses``.

``predict`` runs a pipeline's ``predict`` config the same way (an empty cache, a temporary working folder), after
the ``fit`` of each ``--fit-first`` config in that folder (e.g. the model the pipeline loads from ``outputs/``), and
keeps the JSON files named by ``--keep`` (paths the pipeline writes, relative to the working folder) under
``files``, beside each command's wall-clock seconds and, for a fit that logs to CSV, the last value of each metric it
logged.

``tests`` times the README's test command, ``python -m pytest -q``, in the repository with an empty kglightning
cache, and records the counts of its summary line.

``tutorial`` runs every ``python -m kglightning`` command of a tutorial page's bash blocks, in the page's order, as
a reader who copies them would (continuation lines joined, comments dropped): in a temporary working folder holding
a copy of ``configs/``, from an empty cache, and records each command's wall-clock seconds. ``--skip TEXT`` leaves
out the commands that contain ``TEXT`` (a command on the reader's own files, which the machine does not have); they
are recorded as skipped (``TEXT=WHY`` records why). ``--python-block NAME`` first saves the page's python block
that starts with ``# NAME`` as the reader would; ``--file DEST=SOURCE`` copies a file or folder into the working
folder, such as a stand-in for the reader's own answers (``tools/standin_answers.py``), and ``--about DEST=TEXT``
says what it is. Each ``fit`` step also records the test metrics and epochs of the run it logged.
``tools/docs_numbers.py`` renders the page's ``tutorial-times`` block from the result.

A run that fails, or whose log lacks the metrics or the test split's summary, writes nothing and keeps its temporary
folder with the logs.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# DetectionStats.summary: "test: 1497 questions -> 1497 graphs, 3805 answers (70.5% hallucinated): ..."
SPLIT_LINE = re.compile(
    r"^(?P<split>\w+): (?P<questions>\d+) questions -> (?P<graphs>\d+) graphs, (?P<answers>\d+) answers "
    r"\((?P<hallucinated>[\d.]+)% hallucinated\)",
    flags=re.M,
)


def last_values(rows: Iterable[dict[str, str]], keep: Callable[[str], bool]) -> dict[str, float]:
    """The last logged value of each column that ``keep`` accepts among the ``rows`` of a Lightning ``CSVLogger``
    file, sorted by name."""
    out: dict[str, float] = {}
    for row in rows:
        out.update({k: float(v) for k, v in row.items() if keep(k) and v not in ("", None)})
    return dict(sorted(out.items()))


def test_metrics(rows: list[dict[str, str]], source: Path) -> dict[str, float]:
    """The last logged value of every ``test/*`` column among the ``rows`` of a Lightning ``CSVLogger`` file."""
    out = last_values(rows, lambda k: k.startswith("test/"))
    if not out:
        raise SystemExit(f"{source}: no test/* metric was logged (does the config set test_after_fit: true?)")
    return out


def metrics_file(folder: Path) -> Path:
    """The newest ``metrics.csv`` under ``folder`` (each run has a folder of its own)."""
    found = sorted(folder.rglob("metrics.csv"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"the run wrote no metrics.csv under {folder} (does the config use a CSVLogger?)")
    return found[-1]


def run_metrics(folder: Path) -> tuple[dict[str, float], int]:
    """The ``test/*`` metrics of the one run under ``folder`` and the epochs it trained (counted from the rows that
    log training or validation: the test after ``fit`` logs at the epoch after the last)."""
    path = metrics_file(folder)
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    epochs = [
        int(float(row["epoch"]))
        for row in rows
        if row.get("epoch") not in ("", None) and any(
            v not in ("", None) for k, v in row.items() if k.startswith(("train", "val")))
    ]  # fmt: skip
    return test_metrics(rows, path), max(epochs, default=-1) + 1


def config_values(config: Path) -> dict[str, object]:
    """What the pages say of the recipe: the seed, the epochs allowed and the encoder's width (``None`` if unset)."""
    import yaml

    cfg = yaml.safe_load(config.read_text()) or {}

    def get(*keys: str) -> object:
        node: object = cfg
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    return {
        "seed": get("seed_everything"),
        "max_epochs": get("trainer", "max_epochs"),
        "hidden_channels": get("model", "init_args", "encoder", "init_args", "hidden_channels"),
    }


def split_counts(log: str) -> dict[str, dict[str, float]]:
    """Each split's questions, graphs, answers and hallucinated share, from the data module's summary lines (the
    last line of a split wins)."""
    return {
        m["split"]: {
            "questions": int(m["questions"]),
            "graphs": int(m["graphs"]),
            "answers": int(m["answers"]),
            "hallucinated_percent": float(m["hallucinated"]),
        }
        for m in SPLIT_LINE.finditer(log)
    }


def machine() -> dict[str, object]:
    """What the timing depends on: CPU model, cores this process may use, Python and torch versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return {
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        # result files written by an earlier run of this tool do not change what a run does
        dirty = [line for line in status.splitlines() if not line[3:].startswith("docs/results/")]
    except OSError:
        return None
    return (out.stdout.strip() + ("+changes" if dirty else "")) if out.returncode == 0 else None


#: the main job's stages, by the first line each prints (a regular expression), in the order the run prints them
MARKS = (
    ("start-up", None),
    ("embedded benchmark", re.compile(r"embedded benchmark")),
    ("answer proposals", re.compile(r"proposing answers")),
    ("encodings and graphs", re.compile(r"^(train|validation|test): \d+ questions -> ")),
    ("training", re.compile(r"Epoch 0\b|^\s*\| Name\b|Total params")),
    ("test", re.compile(r"^Testing|test_after_fit|Restoring states from the checkpoint")),
)


def stages(stamped: list[tuple[float, str]], wall: float) -> dict[str, float]:
    """Seconds per stage of :data:`MARKS` from a run's lines and the seconds at which each arrived: each stage runs
    from its first line to the next stage's first line (the last to ``wall``); a stage that printed nothing is left
    out.

    Example:
        >>> stages([(1.0, "building the embedded benchmark"), (5.0, "proposing answers: 10%"), (9.0, "Epoch 0: 1/2")], 12)
        {'start-up': 1.0, 'embedded benchmark': 4.0, 'answer proposals': 4.0, 'training': 3.0}
    """
    first = {"start-up": 0.0}
    for at, line in stamped:
        for name, pattern in MARKS[1:]:
            if name not in first and pattern.search(line):
                first[name] = at
    order = sorted(first.items(), key=lambda kv: kv[1])
    return {name: round((order[i + 1][1] if i + 1 < len(order) else wall) - t, 1) for i, (name, t) in enumerate(order)}


def _run(cmd: list[str], cwd: Path, env: dict[str, str], log_path: Path) -> tuple[float, str, dict[str, float]]:
    """``cmd`` with its output shown and kept; its wall-clock seconds, the output and its :func:`stages`. Exits on
    failure."""
    start = time.perf_counter()
    stamped = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            stamped.append((time.perf_counter() - start, line))
            sys.stdout.write(line)
            log.write(line)
        rc = proc.wait()
    seconds = time.perf_counter() - start
    if rc != 0:
        raise SystemExit(f"{' '.join(cmd)} failed with exit status {rc}; its output is in {log_path}")
    return seconds, log_path.read_text(), stages(stamped, seconds)


def record_fit(args: argparse.Namespace, env: dict[str, str], tmp: Path) -> dict[str, object]:
    """The ``fit`` subcommand: the config run (and rerun) from an empty cache in ``tmp``."""
    config = (ROOT / args.config).resolve()
    if not config.is_file():
        raise SystemExit(f"{args.config}: no such config")
    result: dict[str, object] = {}
    work = tmp / "work"
    work.mkdir()
    if args.install:
        seconds, _, _ = _run(["bash", "tools/install.sh"], ROOT, env, tmp / "install.log")
        result["install_seconds"] = round(seconds, 1)
    env = {**env, "KGLIGHTNING_CACHE": str(tmp / "cache")}  # empty: the first run of a fresh clone
    command = ["python", "-m", "kglightning", "fit", "--config", args.config]
    seconds, output, spans = _run([sys.executable, *command[1:5], str(config)], work, env, tmp / "run.log")
    metrics, epochs = run_metrics(work)
    splits = split_counts(output)
    if "test" not in splits:
        raise SystemExit(f"the run printed no test split summary ('test: N questions -> ...'); see {tmp / 'run.log'}")
    if args.rerun:
        again = tmp / "again"
        again.mkdir()
        rerun_seconds, _, _ = _run([sys.executable, *command[1:5], str(config)], again, env, tmp / "rerun.log")
        rerun, _ = run_metrics(again)
        result["rerun"] = {
            "fit_seconds": round(rerun_seconds, 1),
            "identical_metrics": rerun == metrics,
            "differing": sorted(k for k in metrics.keys() | rerun.keys() if metrics.get(k) != rerun.get(k)),
        }
    if args.misses:
        result["misses"] = detector_misses(args.config, work, env, tmp)
    log_copy = args.output.with_suffix(".metrics.csv")  # beside the result: every logged value, for a reader to check
    log_copy.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(metrics_file(work), log_copy)  # only once the run has passed every check, as the result file
    return {"command": " ".join(command), **_about(), "config": config_values(config), "epochs_trained": epochs,
            "cache": "empty", **result, "fit_seconds": round(seconds, 1), "stages": spans, "splits": splits,
            "metrics": metrics}  # fmt: skip


def detector_misses(config: str, work: Path, env: dict[str, str], tmp: Path) -> dict[str, object]:
    """``tools/detector_misses.py`` on the checkpoint the run in ``work`` wrote: its groups (not its per-answer rows)."""
    ckpts = sorted(work.glob("outputs/**/checkpoints/best*.ckpt"))
    if len(ckpts) != 1:
        raise SystemExit(f"expected one best checkpoint under {work / 'outputs'}, found {[str(c) for c in ckpts]}")
    out = tmp / "misses"
    cmd = [sys.executable, str(ROOT / "tools" / "detector_misses.py"), "--config", str((ROOT / config).resolve()),
           "--ckpt", str(ckpts[0]), "--output", str(out)]  # fmt: skip
    _run(cmd, work, {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))},
         tmp / "misses.log")  # fmt: skip
    groups = json.loads((out / "misses.json").read_text())["groups"]
    command = f"PYTHONPATH=. python tools/detector_misses.py --config {config} --ckpt {ckpts[0].relative_to(work)}"
    return {"command": command, "groups": groups}


def last_logged(folder: Path) -> dict[str, float]:
    """The last logged value of every metric column of the newest ``metrics.csv`` under ``folder`` ({} if none)."""
    if not any(folder.rglob("metrics.csv")):
        return {}
    with open(metrics_file(folder), newline="") as f:
        return last_values(csv.DictReader(f), lambda k: k not in ("epoch", "step"))


def record_predict(args: argparse.Namespace, env: dict[str, str], tmp: Path) -> dict[str, object]:
    """The ``predict`` subcommand: each ``--fit-first`` config's ``fit``, then the config's ``predict``, in one working
    folder from an empty cache; the ``--keep`` files the pipeline wrote."""
    configs = [*args.fit_first, args.config]
    for name in configs:
        if not (ROOT / name).is_file():
            raise SystemExit(f"{name}: no such config")
    work = tmp / "work"
    work.mkdir()
    env = {**env, "KGLIGHTNING_CACHE": str(tmp / "cache")}  # empty: the first run of a fresh clone
    steps = []
    for i, name in enumerate(configs):
        what = "predict" if i == len(configs) - 1 else "fit"
        seconds, _, _ = _run([sys.executable, "-m", "kglightning", what, "--config", str((ROOT / name).resolve())], work,
                          env, tmp / f"run{i}.log")  # fmt: skip
        step: dict[str, object] = {"command": f"python -m kglightning {what} --config {name}",
                                   "seconds": round(seconds, 1)}  # fmt: skip
        if what == "fit":
            step["logged"] = last_logged(work)
        steps.append(step)
    files = {}
    for name in args.keep:
        path = work / name
        if not path.is_file():
            raise SystemExit(f"the run wrote no {name}; its output is in {tmp}")
        files[name] = json.loads(path.read_text())
    return {"command": " && ".join(s["command"] for s in steps), **_about(),
            "config": config_values(ROOT / args.config), "cache": "empty", "steps": steps,
            "seconds": round(sum(s["seconds"] for s in steps), 1), "files": files}  # fmt: skip


def page_commands(page: Path) -> list[str]:
    """The ``python -m kglightning`` commands of ``page``'s bash blocks, in order, continuation lines joined and
    comments dropped (what ``tests/tutorials`` runs)."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(line.split(" #", 1)[0].split())
            if line.startswith("python -m kglightning"):
                out.append(line)
    return out


def record_tutorial(args: argparse.Namespace, env: dict[str, str], tmp: Path) -> dict[str, object]:
    """The ``tutorial`` subcommand: every command of the page, in order, in one working folder from an empty cache."""
    page = (ROOT / args.page).resolve()
    if not page.is_file():
        raise SystemExit(f"{args.page}: no such page")
    commands = page_commands(page)
    if not commands:
        raise SystemExit(f"{args.page}: no `python -m kglightning` command in a bash block")
    work = tmp / "work"
    shutil.copytree(ROOT / "configs", work / "configs")
    for name in args.python_block:  # the reader saves it, as the page says
        (work / name).write_text(page_python_block(page, name), encoding="utf-8")
    files, skips, about = pairs(args.file), pairs(args.skip), dict(pairs(args.about))
    given = {}
    for dest, source in files:
        if not source or not Path(source).exists():
            raise SystemExit(f"--file {dest}={source}: expected DEST=SOURCE with an existing SOURCE")
        if Path(dest).is_absolute() or ".." in Path(dest).parts or dest in ("", "."):
            raise SystemExit(f"--file {dest}={source}: DEST must be a path inside the working folder")
        (work / dest).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if Path(source).is_dir() else shutil.copyfile)(source, work / dest)
        given[dest] = about.get(dest, source)
    env = {**env, "KGLIGHTNING_CACHE": str(tmp / "cache")}  # empty: the first run of a fresh clone
    steps: list[dict[str, object]] = []
    for i, command in enumerate(commands):
        why = next((why or True for text, why in skips if text in command), None)
        if why:
            steps.append({"command": command, "skipped": why})
            continue
        argv = shlex.split(command)
        seconds, _, _ = _run([sys.executable, *argv[1:]], work, env, tmp / f"step{i}.log")
        step: dict[str, object] = {"command": command, "seconds": round(seconds, 1)}
        if argv[3:4] == ["fit"]:  # what it came out with: the test metrics of the run it logged last, and its epochs
            step["test"], step["epochs"] = run_metrics(work)
        steps.append(step)
    rerun = " ".join(["python tools/record_run.py tutorial", args.page,
                      *(f"--python-block {name}" for name in args.python_block),
                      *(f"--file {dest}=FILE" for dest, _ in files),
                      *(shlex.quote(f"--skip={text}") for text, _ in skips)])  # fmt: skip
    return {"page": args.page, **_about(), "cache": "empty at the first step", "rerun": rerun,
            **({"files": given} if given else {}), "steps": steps}  # fmt: skip


def pairs(values: list[str]) -> list[tuple[str, str]]:
    """``KEY=VALUE`` options as ``(KEY, VALUE)`` pairs, split at the first ``=`` (``VALUE`` is ``""`` without one)."""
    return [(key, value) for key, _, value in (v.partition("=") for v in values)]


def page_python_block(page: Path, name: str) -> str:
    """The ``python`` block of ``page`` whose first line is ``# name`` (the file the page asks the reader to save)."""
    for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
        if block.splitlines()[0].strip() == f"# {name}":
            return block
    raise SystemExit(f"{page.relative_to(ROOT)}: no python block starting with `# {name}`")


# pytest's last line: "1822 passed, 13 skipped, 2 deselected, 5 warnings in 1679.12s (0:27:59)"
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed|xpassed)")


def record_tests(args: argparse.Namespace, env: dict[str, str], tmp: Path) -> dict[str, object]:
    """The ``tests`` subcommand: the README's test command in the repository, with an empty kglightning cache."""
    command = ["python", "-m", "pytest", "-q"]
    env = {**env, "KGLIGHTNING_CACHE": str(tmp / "cache")}
    seconds, output, _ = _run([sys.executable, *command[1:]], ROOT, env, tmp / "tests.log")  # exits unless all pass
    return {"command": " ".join(command), **_about(), "seconds": round(seconds, 1), "counts": summary_counts(output)}


def summary_counts(output: str) -> dict[str, int]:
    """The counts of pytest's last summary line (``1822 passed, 13 skipped, ... in 907.94s``)."""
    last = [line for line in output.splitlines() if " in " in line and "passed" in line][-1:]
    if not last:
        raise SystemExit("pytest printed no summary line")
    return {kind.rstrip("s") if kind.startswith("error") else kind: int(n) for n, kind in SUMMARY.findall(last[0])}


@functools.cache
def _about() -> dict[str, object]:
    """The date, commit and machine, taken once: when the run starts (main calls it first)."""
    return {"date": date.today().isoformat(), "commit": _commit(), "machine": machine()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    fit = sub.add_parser("fit", help="a fit config, from an empty cache")
    fit.add_argument("--config", required=True, help="the fit config, relative to the repository root")
    fit.add_argument("--install", action="store_true", help="time `bash tools/install.sh` first")
    fit.add_argument(
        "--rerun", action="store_true", help="run the command again on the cache the first run filled, and record its "
        "time and whether its test metrics are the first run's to the last digit"
    )  # fmt: skip
    fit.add_argument(
        "--misses", action="store_true", help="then run tools/detector_misses.py on the run's checkpoint and keep "
        "its groups (what the detector catches and misses) in the result"
    )  # fmt: skip
    predict = sub.add_parser("predict", help="a pipeline's predict config (after fit configs), from an empty cache")
    predict.add_argument("--config", required=True, help="the predict config, relative to the repository root")
    predict.add_argument("--fit-first", nargs="*", default=[], help="fit configs to run first, in that order")
    predict.add_argument("--keep", nargs="+", required=True, help="JSON files the run writes (relative to its "
                         "working folder) to keep in the result")  # fmt: skip
    tests = sub.add_parser("tests", help="the README's test command, `python -m pytest -q`")
    tutorial = sub.add_parser("tutorial", help="every command of a tutorial page, in order, from an empty cache")
    tutorial.add_argument("page", help="the page, relative to the repository root (docs/tutorials/...)")
    tutorial.add_argument("--skip", action="append", default=[], metavar="TEXT[=WHY]",
                          help="leave out the commands that contain TEXT (recorded as skipped, with WHY when given: "
                          "the page then says it rather than that the command reads your own files)")  # fmt: skip
    tutorial.add_argument("--python-block", action="append", default=[], metavar="NAME",
                          help="save the page's python block that starts with `# NAME` as NAME first")  # fmt: skip
    tutorial.add_argument("--file", action="append", default=[], metavar="DEST=SOURCE",
                          help="copy SOURCE (a file or folder) to DEST in the working folder first: the reader's "
                          "own files, or a stand-in for them (recorded with --about)")  # fmt: skip
    tutorial.add_argument("--about", action="append", default=[], metavar="DEST=TEXT",
                          help="what the file copied to DEST is, as the page's times block says it")  # fmt: skip
    for p in (fit, predict, tests, tutorial):
        p.add_argument("--output", required=True, type=Path, help="the result file (JSON) to write")
    args = parser.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    _about()  # the commit as the run starts, not as it ends
    tmp = Path(tempfile.mkdtemp(prefix="kglightning-record-"))
    records = {"fit": record_fit, "predict": record_predict, "tests": record_tests, "tutorial": record_tutorial}
    record = records[args.what]
    result = record(args, env, tmp)  # a failure keeps tmp and its logs
    shutil.rmtree(tmp, ignore_errors=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
