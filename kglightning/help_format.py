"""``--help`` that shows each option's default (floor 0: imports nothing of kglightning).

Every file command's parser (``select``, ``evaluate``, ``conformalize``, ``import-predictions``, ``cache``,
``build-benchmark``, ``build-subgraphs``, ``compare-proxies``, ``seeds``) uses :class:`DefaultsHelpFormatter`, so the
help says what an option is when it is not given, as the defaults of the trainer subcommands (LightningCLI's) do.
"""

from __future__ import annotations

import argparse
import re
import textwrap


def _shown(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


class ListsHelpFormatter(argparse.HelpFormatter):
    """Keeps the bullet lists of an option's help (a docstring's ``- item`` lines, nested by their indentation) as
    lists, where argparse would run them into one paragraph; a help without such a line is wrapped as argparse
    wraps it.

    Example:
        >>> text = "Where to resume. One of:\\n\\n    - best: the best checkpoint\\n    - last: the last one"
        >>> ListsHelpFormatter("prog")._split_lines(text, 24)
        ['Where to resume. One of:', '- best: the best', '  checkpoint', '- last: the last one']
    """

    def _split_lines(self, text: str, width: int) -> list[str]:
        if not re.search(r"^\s*- \S", text, flags=re.M):
            return super()._split_lines(text, width)
        blocks: list[tuple[int | None, list[str]]] = []  # (the bullet's indentation or None for prose, its words)
        for line in text.splitlines():
            words = line.split()
            if not words:
                blocks.append((None, []))
            elif words[0] == "-":
                blocks.append((len(line) - len(line.lstrip()), words[1:]))
            elif blocks and blocks[-1][1]:
                blocks[-1][1].extend(words)
            else:
                blocks.append((None, words))
        indents = sorted({indent for indent, _ in blocks if indent is not None})
        out: list[str] = []
        for indent, words in blocks:
            if not words:
                continue
            pad = "" if indent is None else "  " * indents.index(indent)
            first, rest = (pad, pad) if indent is None else (pad + "- ", pad + "  ")
            out += textwrap.wrap(" ".join(words), width, initial_indent=first, subsequent_indent=rest,
                                 break_on_hyphens=False)  # fmt: skip
        return out


class DefaultsHelpFormatter(ListsHelpFormatter):
    """Appends ``(default: ...)`` to an option's help when it has a default worth showing: not ``None``, ``False``
    or empty, and not already in the help; a list default is shown as it is typed (``top fdr``). The docstrings'
    double backticks, which descriptions and helps take from them, are shown as single ones in a terminal."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(text.replace("``", "`"))

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help.replace("``", "`") if action.help else action.help
        default = action.default
        if (
            not text
            or "default" in text.lower()  # the help says it already, in its own words
            or not action.option_strings
            or default is None
            or default is False
            or default is argparse.SUPPRESS
            or default in ([], ())
        ):
            return text
        return f"{text} (default: {_shown(default).replace('%', '%%')})"
