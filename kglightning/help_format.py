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
    lists, where argparse would run them into one paragraph. A line indented deeper than its bullet continues it;
    a line that is not, and the ``(type: ..., default: ...)`` that jsonargparse appends, start a paragraph of their
    own. A help without a bullet line is wrapped as argparse wraps it.

    Example:
        >>> text = "Where to resume. One of:\\n\\n    - best: the best checkpoint\\n    - last: the last one (type: str)"
        >>> ListsHelpFormatter("prog")._split_lines(text, 24)
        ['Where to resume. One of:', '- best: the best', '  checkpoint', '- last: the last one', '(type: str)']
        >>> ListsHelpFormatter("prog")._split_lines("- x: y\\nThis is prose.", 60)
        ['- x: y', 'This is prose.']
    """

    def _split_lines(self, text: str, width: int) -> list[str]:
        if not re.search(r"^\s*- \S", text, flags=re.M):
            return super()._split_lines(text, width)
        tail = re.search(r"\s(\((?:type|default): .*\))\s*$", text, flags=re.S)  # jsonargparse's suffix
        if tail:
            text = text[: tail.start()]
        blocks: list[tuple[int | None, list[str]]] = []  # (the bullet's indentation, or None for prose; its words)
        for line in text.splitlines():
            words, indent = line.split(), len(line) - len(line.lstrip())
            if not words:
                blocks.append((None, []))
            elif words[0] == "-":
                blocks.append((indent, words[1:]))
            elif blocks and blocks[-1][1] and (blocks[-1][0] is None or indent > blocks[-1][0]):
                blocks[-1][1].extend(words)
            else:
                blocks.append((None, words))
        if tail:
            blocks.append((None, tail.group(1).split()))
        indents = sorted({bullet for bullet, _ in blocks if bullet is not None})
        out: list[str] = []
        for bullet, words in blocks:
            if not words:
                continue
            pad = "" if bullet is None else "  " * indents.index(bullet)
            first, rest = (pad, pad) if bullet is None else (pad + "- ", pad + "  ")
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
