"""Fixtures of the tutorial tests: a page's commands as a reader would copy them, and a runner of those commands."""

from __future__ import annotations

import functools
import importlib.util
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


#: what every tutorial run adds: the tiny text encoder's class (its folder comes from the fixture), two epochs
TINY_RUN = ["--data.init_args.encoder", "kglightning.data.SentenceEncoder", "--trainer.max_epochs", "2",
            "--trainer.enable_progress_bar", "false"]  # fmt: skip
#: a smaller graph encoder than the configs' (hidden 128, 8 heads)
SMALL_MODEL = [
    "--model.init_args.encoder.init_args.hidden_channels",
    "32",
    "--model.init_args.encoder.init_args.heads",
    "4",
]
#: part of the embedded data
EMBEDDED_PART = ["--data.init_args.max_records", "{train: 120, validation: 60, test: 60}"]


def _text(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


@functools.cache
def _record_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("record_run", ROOT / "tools" / "record_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commands(page: str) -> list[list[str]]:
    # the same reading as tools/record_run.py's, which times these commands for the page
    return [shlex.split(line) for line in _record_run().page_commands(ROOT / page)]


@pytest.fixture
def page_commands() -> Callable[[str], list[list[str]]]:
    """``page_commands("docs/tutorials/x.md")``: the ``python -m kglightning ...`` commands of the page's bash blocks,
    in order, continuation lines joined and comments dropped."""
    return _commands


@pytest.fixture
def page_text() -> Callable[[str], str]:
    """``page_text("docs/tutorials/x.md")``: the page as written."""
    return _text


@pytest.fixture
def tiny_options(tiny_encoder_dir) -> Callable[..., list[str]]:
    """``tiny_options(small_model=True, part=True)``: the options a tutorial test adds to a page's ``fit`` or
    ``predict``: the tiny text encoder and two epochs, with a smaller graph encoder and part of the embedded data
    unless told otherwise."""

    def options(*, small_model: bool = True, part: bool = True) -> list[str]:
        return [*TINY_RUN, "--data.init_args.encoder.init_args.model", tiny_encoder_dir,
                *(SMALL_MODEL if small_model else []), *(EMBEDDED_PART if part else [])]  # fmt: skip

    return options


@pytest.fixture
def run_command(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """``run_command(command, *extra)``: runs a page's command as a subprocess in ``tmp_path`` (the repository's
    ``configs/`` files, this checkout's package, no network, a private cache), with ``extra`` options appended;
    fails the test on a non-zero exit, with the output's tail."""
    env = dict(os.environ, KGLIGHTNING_CACHE=str(tmp_path / "cache"), WANDB_MODE="offline", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(ROOT))  # fmt: skip

    def run(command: list[str], *extra: str) -> subprocess.CompletedProcess:
        argv = [sys.executable, *command[1:], *extra]
        argv = [str(ROOT / a) if a.startswith("configs/") else a for a in argv]
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, " ".join(argv) + "\n" + proc.stdout[-3000:] + proc.stderr[-6000:]
        return proc

    return run
