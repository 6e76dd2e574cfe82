"""``--help`` that shows each option's default (floor 0: imports nothing of kglightning).

Every file command's parser (``select``, ``evaluate``, ``conformalize``, ``import-predictions``, ``cache``,
``build-benchmark``, ``build-subgraphs``, ``compare-proxies``, ``seeds``) uses :class:`DefaultsHelpFormatter`, so the
help says what an option is when it is not given, as the defaults of the trainer subcommands (LightningCLI's) do.
"""

from __future__ import annotations

import argparse


def _shown(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


class DefaultsHelpFormatter(argparse.HelpFormatter):
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
