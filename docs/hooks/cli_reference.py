"""MkDocs hook: the CLI reference page, written at build time from kglightning's own parsers.

``docs/reference/cli.md`` holds a marker; this hook replaces it with the output of ``kglightning --help`` and of
``kglightning <subcommand> --help`` for every subcommand that the top-level help lists. The help is produced by
:func:`kglightning.cli.main`, the function behind ``python -m kglightning``, in this process, so the page cannot
drift from what a user's terminal shows. Only the layout is fixed: argparse formats at :data:`COLUMNS` characters, the
lines it cannot wrap (a long usage token, a class's description) are wrapped at :data:`WIDTH` by :func:`tidy`, and
control characters (jsonargparse writes a backspace before ``[=flags]``) are dropped.

The module imports nothing from MkDocs, so ``tests/test_docs.py`` can call :func:`subcommands` and :func:`render`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import textwrap
from typing import Any

#: the page (relative to docs/) and the marker in it that the generated reference replaces
PAGE = "reference/cli.md"
MARKER = "<!-- cli-reference -->"
#: help text width, so that the page does not depend on the terminal that builds it
COLUMNS = 88
#: no line of the page is longer (the site's code blocks show about 90 columns at 1280 px)
WIDTH = 90


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


def _split_token(token: str, width: int) -> list[str]:
    """A token longer than ``width`` cut after commas (``{fit,validate,...}``), or where it must."""
    parts, line = [], ""
    for piece in re.findall(r"[^,]*,?", token):
        if line and len(line) + len(piece) > width:
            parts.append(line)
            line = ""
        line += piece
    parts.append(line)
    return [chunk for part in parts for chunk in (textwrap.wrap(part, width, break_on_hyphens=False) or [part])]


def tidy(text: str, width: int = WIDTH) -> str:
    """``text`` without control characters, every line at most ``width`` long: a longer line is wrapped at spaces,
    its continuation lines indented two more than it, and a token that alone is too long is cut after commas.

    Example:
        >>> tidy("  --print_config \\x08[=flags]")
        '  --print_config[=flags]'
        >>> tidy("    {a,bb,ccc,dddd}", width=12).splitlines()
        ['    {a,bb,', '      ccc,', '      dddd}']
    """
    text = re.sub(r" ?\x08", "", text)  # a backspace erases the space before it, as a terminal shows it
    text = re.sub(r"[\x00-\x08\x0b-\x1f\x7f]", "", text)
    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        more = indent + "  "
        current = indent
        for token in line.split():
            for k, word in enumerate(_split_token(token, max(width - len(more), 1))):
                glue = "" if k or not current.strip() else " "  # a cut token's pieces join without a space
                if current.strip() and len(current) + len(glue) + len(word) > width:
                    out.append(current)
                    current, glue = more, ""
                current += glue + word
        out.append(current)
    return "\n".join(out)


def subcommands(top_level_help: str) -> list[str]:
    """The subcommands that ``kglightning --help`` lists under ``SUBCOMMAND`` (one per line, four spaces in), in
    order."""
    section = top_level_help.partition("\n  SUBCOMMAND\n")[2]
    names = re.findall(r"^    ([a-z][a-z0-9-]*)(?:  |$)", section, flags=re.M)
    if not names:
        raise RuntimeError("no SUBCOMMAND list in `kglightning --help`")
    return names


def render() -> str:
    """The Markdown of the whole reference: the top-level help, then one section per subcommand."""
    top = help_text([])
    parts = [
        "## `kglightning`",
        "",
        "`python -m kglightning` and the `kglightning` console script are the same program.",
        "",
        "```text",
        tidy(top),
        "```",
    ]
    for name in subcommands(top):
        parts += ["", f"## `kglightning {name}`", "", "```text", tidy(help_text([name])), "```"]
    return "\n".join(parts) + "\n"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: fill the CLI reference page."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise RuntimeError(f"{PAGE} lost its marker {MARKER}")
    return markdown.replace(MARKER, render())
