"""Fixtures of the tutorial tests: a page's commands as a reader would copy them, and a runner of those commands."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _commands(page: str) -> list[list[str]]:
    out = []
    for block in re.findall(r"```bash\n(.*?)```", (ROOT / page).read_text(encoding="utf-8"), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line.startswith("python -m kglightning"):
                out.append(shlex.split(line))
    return out


@pytest.fixture
def page_commands() -> Callable[[str], list[list[str]]]:
    """``page_commands("docs/tutorials/x.md")``: the ``python -m kglightning ...`` commands of the page's bash blocks,
    in order, continuation lines joined and comments dropped."""
    return _commands


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
