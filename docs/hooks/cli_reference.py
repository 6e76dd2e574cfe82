"""MkDocs hook: the CLI reference page, written at build time from kglightning's own parsers.

``docs/reference/cli.md`` holds a marker; this hook replaces it with the output of ``kglightning --help`` and of
``kglightning <subcommand> --help`` for every subcommand that the top-level help lists. The help is produced by
:func:`kglightning.cli.main`, the function behind ``python -m kglightning``, in this process, so the page cannot
drift from what a user's terminal shows (only the line width is fixed, at :data:`COLUMNS` characters).

The module imports nothing from MkDocs, so ``tests/test_docs.py`` can call :func:`subcommands` and :func:`render`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from typing import Any

#: the page (relative to docs/) and the marker in it that the generated reference replaces
PAGE = "reference/cli.md"
MARKER = "<!-- cli-reference -->"
#: help text width, so that the page does not depend on the terminal that builds it
COLUMNS = 100


def help_text(args: list[str]) -> str:
    """What ``python -m kglightning *args --help`` prints."""
    from kglightning.cli import main

    out = io.StringIO()
    previous, argv = os.environ.get("COLUMNS"), sys.argv
    os.environ["COLUMNS"] = str(COLUMNS)
    sys.argv = ["kglightning"]  # LightningCLI warns when it is given args while sys.argv holds the caller's
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            try:
                main([*args, "--help"])
            except SystemExit:
                pass
    finally:
        sys.argv = argv
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous
    text = out.getvalue().rstrip()
    if not text:
        raise RuntimeError(f"`kglightning {' '.join([*args, '--help'])}` printed nothing")
    return text


def subcommands(top_level_help: str) -> list[str]:
    """The subcommands listed in the usage line of ``kglightning --help`` (``{fit,validate,...}``), in order."""
    m = re.search(r"\{([a-z][a-z0-9_,-]*)\}", top_level_help)
    if m is None:
        raise RuntimeError("no {subcommand,...} list in `kglightning --help`")
    return m.group(1).split(",")


def render() -> str:
    """The Markdown of the whole reference: the top-level help, then one section per subcommand."""
    top = help_text([])
    parts = [
        "## `kglightning`",
        "",
        "`python -m kglightning` and the `kglightning` console script are the same program.",
        "",
        "```text",
        top,
        "```",
    ]
    for name in subcommands(top):
        parts += ["", f"## `kglightning {name}`", "", "```text", help_text([name]), "```"]
    return "\n".join(parts) + "\n"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: fill the CLI reference page."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise RuntimeError(f"{PAGE} lost its marker {MARKER}")
    return markdown.replace(MARKER, render())
