"""MkDocs hook: the CLI reference pages, written at build time from kglightning's own parsers.

``docs/reference/cli.md`` holds a marker that this hook replaces with the output of ``kglightning --help`` and a
table of the subcommands; each subcommand has a page ``docs/reference/cli/<subcommand>.md`` whose marker
``<!-- cli-reference: <subcommand> -->`` gets the output of ``kglightning <subcommand> --help``, one section per
group of options: Lightning's Trainer options folded (there are about 50), the reST markup of Lightning's help
(double backticks, ``:class:`` roles, links) written as plain text (:func:`plain`). The help is produced by
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
#: a subcommand's page, and its marker
COMMAND_PAGE = "reference/cli/{}.md"
COMMAND_MARKER = re.compile(r"<!-- cli-reference: ([a-z][a-z0-9-]*) -->")
#: the option groups of LightningCLI's subcommands that get a heading of their own, by their first option
LIGHTNING_GROUPS = {"--trainer": "Trainer", "--model": "Model", "--data": "Data", "--optimizer": "Optimizer",
                    "--lr_scheduler": "Learning-rate scheduler"}  # fmt: skip
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


def plain(text: str) -> str:
    """Lightning's reST markup written as a terminal reader would want it: ````x```` and ```x``` as ``x``, a role
    (``:class:`~a.b.C```) as its target's name, a link ```text <url>`_`` as ``text (url)``.

    Example:
        >>> plain("Default: ``\\"auto\\"``. See :class:`~lightning.pytorch.Trainer` and `the notes <https://x.y>`_.")
        'Default: "auto". See Trainer and the notes (https://x.y).'
        >>> plain("Stop after `N` epochs; `-1` for none, e.g. `s3://mybucket/path`.")
        'Stop after N epochs; -1 for none, e.g. s3://mybucket/path.'
    """
    # argparse cuts a word longer than its help column (a role's dotted target) across lines: a role holds no space,
    # so a line break inside one is such a cut
    text = re.sub(r":(?:[a-z]|\n\s+)+:`(?:[^`\s]|\n\s+)+`", lambda m: re.sub(r"\n\s+", "", m.group(0)), text)
    text = re.sub(r"``(.+?)``", r"\1", text, flags=re.S)
    text = re.sub(r":(?:py:)?[a-z]+:`~?(?:[\w.]*\.)?([^`.]+)`", r"\1", text)
    text = re.sub(r"`([^`<]+?)\s*<([^>]+)>`_", r"\1 (\2)", text, flags=re.S)
    return re.sub(r"(?<![`\w])`([^`\s](?:[^`\n]*[^`\s])?)`(?![`\w])", r"\1", text)  # reST's default role: code


def groups(help_text: str) -> tuple[str, list[tuple[str, str]]]:
    """A subcommand's help split into its usage and description, and ``(title, options)`` for each group of options
    (argparse writes a group as a title line ending with ``:`` and the options indented under it)."""
    head: list[str] = []
    found: list[list[str]] = []
    for chunk in help_text.split("\n\n"):
        lines = chunk.split("\n")
        first = next((i for i, line in enumerate(lines) if re.match(r"  (-|\S+ -->)", line)), None)
        if first is None or first == 0:  # prose, or a group's text that a blank line split
            (found[-1] if found else head).append(chunk)
        else:
            found.append([" ".join(line.strip() for line in lines[:first]).rstrip(":"), "\n".join(lines[first:])])
    return "\n\n".join(head), [(title, "\n\n".join(blocks)) for title, *blocks in found]


def _title(command: str, title: str, options: str) -> str:
    first = re.match(r"\s*(--[a-z_]+)", options)
    if first and first.group(1) in LIGHTNING_GROUPS:
        return f"{LIGHTNING_GROUPS[first.group(1)]}: `{first.group(1)}`"
    if first and command in ("fit", "validate", "test", "predict") and title not in ("options", "Linked arguments"):
        return f"Arguments of `Trainer.{command}`"  # the method's own arguments, titled by its docstring's first line
    return title[:1].upper() + title[1:]


def render_command(name: str) -> str:
    """The Markdown of one subcommand's reference: its usage and description, then each group of options under a
    heading, the Trainer's options folded."""
    head, found = groups(tidy(plain(tidy(help_text([name])))))
    parts = ["```text", head, "```"]
    for title, options in found:
        heading = _title(name, title, options)
        block = ["```text", *options.split("\n"), "```"]
        parts += ["", f"## {heading}", ""]
        if heading.startswith("Trainer:"):
            count = len(re.findall(r"^  --trainer\.(?!.*\.help\b)\S+", options, flags=re.M))
            parts += [f'??? note "{count} options of Lightning\'s Trainer (open to read them)"', ""]
            block = ["    " + line if line else line for line in block]
        parts += block
    return "\n".join(parts) + "\n"


def render() -> str:
    """The Markdown of the reference's first page: the top-level help, then a table of the subcommands."""
    top = help_text([])
    parts = [
        "## `kglightning`",
        "",
        "`python -m kglightning` and the `kglightning` console script are the same program.",
        "",
        "```text",
        plain(tidy(top)),
        "```",
        "",
        "## Subcommands",
        "",
        "| subcommand | what it does |",
        "|---|---|",
    ]
    section = top.partition("\n  SUBCOMMAND\n")[2]
    for name in subcommands(top):
        summary = re.search(rf"^    {re.escape(name)}(?: +(.*))?\n((?: {{8,}}.*\n)*)", section + "\n", flags=re.M)
        lines = [summary.group(1) or "", *summary.group(2).splitlines()] if summary else []
        text = " ".join(line.strip() for line in lines if line.strip())
        cell = plain(text).replace("|", "\\|")
        parts.append(f"| [`{name}`](cli/{name}.md) | {cell} |")
    return "\n".join(parts) + "\n"


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """MkDocs event: fill the CLI reference pages."""
    if page.file.src_uri == PAGE:
        if MARKER not in markdown:
            raise RuntimeError(f"{PAGE} lost its marker {MARKER}")
        return markdown.replace(MARKER, render())
    match = COMMAND_MARKER.search(markdown)
    if match and page.file.src_uri == COMMAND_PAGE.format(match.group(1)):
        return markdown.replace(match.group(0), render_command(match.group(1)))
    return markdown
