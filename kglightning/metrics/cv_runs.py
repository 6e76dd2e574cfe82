"""The runs of one ``kglightning seeds`` command, kept in a json file that is rewritten after every run.

A :class:`RunLog` holds the test metrics of every (fold, seed) run done so far with the arguments that produced
them, and writes them, with the summary and the scorer comparison of :mod:`kglightning.metrics.cv_table`, after
every run: a command that fails part-way loses only the run it was in. :meth:`RunLog.resume` reads such a file back
so that a new command skips the runs it holds, and refuses when that file was written with other arguments.

The file (``--output``) holds ``arguments``, ``complete`` (every asked run is done), ``summary`` and ``comparison``;
with folds, ``runs[fold][seed]`` (each run's metrics) and ``fold_means[metric][fold]``; without, ``seeds[seed]``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kglightning.fileio import write_text_atomic
from kglightning.metrics.cv_table import (
    compare_scorers,
    comparison_table,
    summarize_folds,
    summarize_seeds,
    summary_table,
)

__all__ = ["RunLog", "config_arguments"]

#: the stored arguments that may differ when a run log is resumed (more or fewer seeds)
_MAY_DIFFER = ("seeds",)


def config_arguments(configs: Sequence[str], overrides: Sequence[str], **options: Any) -> dict[str, Any]:
    """The arguments a run log is written with: the config files (each with a hash of its content, so an edited
    config is not taken for the same one), the options passed to them, and the command's own ``options``.

    Example:
        >>> args = config_arguments([], ["--trainer.max_epochs", "2"], folds=5, seeds=[0, 1])
        >>> args["overrides"], args["folds"]
        (['--trainer.max_epochs', '2'], 5)
    """
    digests = [hashlib.sha1(Path(c).read_bytes()).hexdigest()[:12] if Path(c).is_file() else "" for c in configs]
    return {"config": list(configs), "config_sha1": digests, "overrides": list(overrides), **options}


class RunLog:
    """The test metrics of every (fold, seed) run of one command, written to ``path`` (if any) after each run.

    Args:
        arguments: what the runs were made with (:func:`config_arguments`); ``arguments["seeds"]`` is the seeds
            asked for and ``arguments["folds"]`` the number of folds, ``None`` without folds.
        path: the json file, or ``None`` to keep the runs in memory only.

    Example:
        >>> log = RunLog({"seeds": [0, 1], "folds": 2})
        >>> log.add(0, 0, {"test/f1": 0.5}); log.add(0, 1, {"test/f1": 0.7})
        >>> log.pending()
        [(1, 0), (1, 1)]
        >>> log.payload()["runs"]["0"]["1"], log.payload()["complete"]
        ({'test/f1': 0.7}, False)
    """

    def __init__(self, arguments: Mapping[str, Any], path: str | Path | None = None) -> None:
        self.arguments = dict(arguments)
        self.path = Path(path) if path is not None else None
        self.folds: int | None = self.arguments.get("folds")
        self.seeds: list[int] = [int(s) for s in self.arguments["seeds"]]
        self.runs: dict[str, dict[str, dict[str, float]]] = {}  # fold ("-" without folds) -> seed -> metrics
        self.fold_settings: dict[str, Any] | None = None

    @classmethod
    def resume(cls, path: str | Path, arguments: Mapping[str, Any]) -> RunLog:
        """The run log at ``path`` with the runs it holds, to go on with ``arguments`` (an empty one when there is no
        file yet).

        Raises:
            ValueError: the file was written with other arguments (the seeds aside), or by a version without them.
        """
        log = cls(arguments, path)
        if not Path(path).is_file():
            return log
        stored = json.loads(Path(path).read_text(encoding="utf-8"))
        before = stored.get("arguments")
        if not isinstance(before, dict):
            raise ValueError(f"--resume: {path} holds no stored arguments (written before --resume existed); "
                             "start a new --output")  # fmt: skip
        keys = sorted((set(before) | set(log.arguments)) - set(_MAY_DIFFER))
        differ = [k for k in keys if before.get(k) != log.arguments.get(k)]
        if differ:
            detail = "; ".join(f"{k}: stored {before.get(k)!r}, now {log.arguments.get(k)!r}" for k in differ)
            raise ValueError(f"--resume: {path} was written with other arguments ({detail}); run with the same "
                             "config and options, or write to a new --output")  # fmt: skip
        if log.folds is None:
            log.runs = {"-": {str(s): dict(m) for s, m in stored.get("seeds", {}).items()}}
        else:
            log.runs = {str(f): {str(s): dict(m) for s, m in g.items()} for f, g in stored.get("runs", {}).items()}
        log.fold_settings = stored.get("fold_settings")
        return log

    def pairs(self) -> list[tuple[int | None, int]]:
        """Every (fold, seed) run asked for, fold by fold (``fold`` is ``None`` without folds)."""
        folds: list[int | None] = list(range(self.folds)) if self.folds is not None else [None]
        return [(f, s) for f in folds for s in self.seeds]

    def has(self, fold: int | None, seed: int) -> bool:
        """Whether the run of ``(fold, seed)`` is done."""
        return str(seed) in self.runs.get("-" if fold is None else str(fold), {})

    def run(self, fold: int | None, seed: int) -> dict[str, float]:
        """The metrics of the done run of ``(fold, seed)``.

        Raises:
            KeyError: that run is not done.
        """
        return self.runs["-" if fold is None else str(fold)][str(seed)]

    def pending(self) -> list[tuple[int | None, int]]:
        """The asked runs not done yet, in the order they run."""
        return [(f, s) for f, s in self.pairs() if not self.has(f, s)]

    def add(self, fold: int | None, seed: int, metrics: Mapping[str, float]) -> None:
        """Keep one run's metrics and rewrite the file."""
        self.runs.setdefault("-" if fold is None else str(fold), {})[str(seed)] = {k: float(v) for k, v in
                                                                                  metrics.items()}  # fmt: skip
        self.write()

    def asked(self) -> dict[str, dict[str, dict[str, float]]]:
        """The done runs of the asked pairs, ``{group: {seed: metrics}}``: a group per fold, or one per seed."""
        if self.folds is None:
            done = self.runs.get("-", {})
            return {str(s): {str(s): done[str(s)]} for s in self.seeds if str(s) in done}
        out: dict[str, dict[str, dict[str, float]]] = {}
        for fold, seed in self.pairs():
            if self.has(fold, seed):
                out.setdefault(str(fold), {})[str(seed)] = self.runs[str(fold)][str(seed)]
        return out

    def payload(self) -> dict[str, Any]:
        """What the file holds: the arguments, every run, and the summary and comparison of the asked runs."""
        groups = self.asked()
        out: dict[str, Any] = {"arguments": self.arguments, "complete": not self.pending()}
        if self.fold_settings is not None:
            out["fold_settings"] = self.fold_settings
        if self.folds is None:
            out["seeds"] = self.runs.get("-", {})
            out["summary"] = summarize_seeds({s: g[s] for s, g in groups.items()})
            out["comparison"] = compare_scorers(groups, unit="seeds")
        else:
            out["runs"] = self.runs
            out["summary"], out["fold_means"] = summarize_folds(groups)
            out["comparison"] = compare_scorers(groups, unit="folds")
        return out

    def write(self) -> None:
        """Rewrite the file (atomically) with :meth:`payload`; nothing without a path."""
        if self.path is not None:
            write_text_atomic(self.path, json.dumps(self.payload(), indent=2) + "\n")

    def label(self) -> str:
        """What the runs are, e.g. ``"5 folds x seeds 0, 1"``."""
        seeds = f"seeds {', '.join(map(str, self.seeds))}"
        return f"{self.folds} folds x {seeds}" if self.folds is not None else seeds

    def tables(self) -> str:
        """The markdown the command prints: the summary of every metric, then the scorers side by side."""
        payload = self.payload()
        out = summary_table(payload["summary"], payload.get("fold_means"), label=self.label())
        return out + "\n\n" + comparison_table(payload["comparison"])

    def write_outputs(self, title: str = "") -> list[Path]:
        """Write the json, the tables as a ``.md`` beside it and, when the test metrics have F1 or AUC-PR, the plot
        of :func:`~kglightning.metrics.plots.plot_seed_summary` as a ``.png``; returns the files written.

        Raises:
            ValueError: the log has no path.
        """
        from kglightning.metrics.plots import plot_seed_summary

        if self.path is None:
            raise ValueError("this run log has no path to write to")
        self.write()
        md = self.path.with_suffix(".md")
        write_text_atomic(md, self.tables() + "\n")
        over = "folds" if self.folds is not None else "seeds"
        heading = f"{title}, {self.label()}" if title else self.label()
        plot = plot_seed_summary(self.payload()["summary"], self.path.with_suffix(".png"), title=heading, over=over)
        return [self.path, md] + ([plot] if plot is not None else [])
