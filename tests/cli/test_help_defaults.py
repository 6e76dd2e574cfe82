"""Issue 59: every file command's ``--help`` shows each option's default, and the defaults agree with the docs."""

from __future__ import annotations

import argparse
import contextlib
import io
import re

import pytest

from kglightning.cli import main
from kglightning.help_format import DefaultsHelpFormatter

FILE_COMMANDS = ("select", "evaluate", "conformalize", "import-predictions", "cache", "build-benchmark",
                 "build-subgraphs")  # fmt: skip


def _help(command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main([command, "--help"])
    return " ".join(out.getvalue().split())  # argparse wraps lines: compare on single spaces


@pytest.mark.parametrize("command", FILE_COMMANDS)
def test_every_file_command_shows_its_defaults_and_never_a_none(command):
    text = _help(command)
    assert "(default: " in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_select_help_shows_the_defaults_the_docs_name():
    text = _help("select")
    assert "(default: top)" in text  # --rule
    assert "(default: hallucination_logit)" in text  # --score
    assert re.search(r"--alpha .*\(default: 0\.1\)", text)


@pytest.mark.parametrize(
    ("command", "shown"),
    [("build-benchmark", "--seed SEED seed of the split, the subgraph sampling and the missing answers (default: 0)"),
     ("import-predictions", "(default: 0.6 0.2 0.2)"), ("evaluate", "(default: -1)"), ("cache", None)],
)  # fmt: skip
def test_defaults_the_help_did_not_state_are_shown_once(command, shown):
    text = _help(command)
    if shown:
        assert shown in text
    # a help that states its default in its own words is left alone: no default is said twice
    assert not re.search(r"\(default: ([^)]*)\) \(default: \1\)", text)
    assert "(default) (default:" not in text


def test_the_trainer_driven_commands_show_their_defaults_too():
    assert "(default: 0 1 2)" in _help("seeds")


def test_the_formatter_shows_lists_as_typed_and_escapes_percent():
    p = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    p.add_argument("--rule", nargs="+", default=["top", "fdr"], help="rules")
    p.add_argument("--fmt", default="%d%%", help="a format")
    p.add_argument("--flag", action="store_true", help="a flag")
    p.add_argument("--given", default=3, help="already says it (default: %(default)s)")
    text = " ".join(p.format_help().split())
    assert "rules (default: top fdr)" in text and "a format (default: %d%%)" in text
    assert "a flag (default" not in text and text.count("(default: 3)") == 1


def test_the_library_defaults_agree_with_the_cli_and_the_docs():
    import inspect

    from kglightning.callbacks import SelectionCallback
    from kglightning.conformal import AnswerSelector
    from kglightning.conformal.selection_io import read_scored

    assert AnswerSelector().rule == "top"
    assert inspect.signature(SelectionCallback).parameters["score"].default == "hallucination_logit"
    assert inspect.signature(read_scored).parameters["score"].default == "hallucination_logit"


def test_no_double_backtick_reaches_a_terminal_help():
    import subprocess
    import sys

    for command in ("select", "evaluate", "cache", "conformalize"):
        out = subprocess.run([sys.executable, "-m", "kglightning", command, "--help"], capture_output=True, text=True)
        assert out.returncode == 0 and "``" not in out.stdout, (command, out.stdout[:500])
