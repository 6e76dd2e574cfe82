"""MkDocs hook: a qualified module name in the navigation may break after each of its dots, and nowhere else.

The API section lists pages by qualified names (``kglightning.data.sources.embedded.builder``), wider than the
sidebar; without a break opportunity a browser cuts them where the line ends, inside a word. A ``<wbr>`` after each
dot lets the name wrap at its dots (``docs/stylesheets/layout.css`` lets the labels wrap at all).

The module imports nothing from MkDocs, so ``tests/test_docs.py`` can call :func:`break_names`.
"""

from __future__ import annotations

import re
from typing import Any

#: a navigation label that is a dotted ``kglightning`` name (the whole label)
LABEL = re.compile(r'(<span class="md-ellipsis">\s*)(kglightning(?:\.\w+)+)(\s*</span>)')


def break_names(html: str) -> str:
    """``html`` with a ``<wbr>`` after each dot of the navigation's qualified names.

    Example:
        >>> break_names('<span class="md-ellipsis"> kglightning.data.kg </span> kglightning.data')
        '<span class="md-ellipsis"> kglightning.<wbr>data.<wbr>kg </span> kglightning.data'
    """
    return LABEL.sub(lambda m: m.group(1) + m.group(2).replace(".", ".<wbr>") + m.group(3), html)


def on_post_page(output: str, page: Any, config: Any) -> str:
    return break_names(output)
