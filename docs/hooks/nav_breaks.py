"""MkDocs hook: a long name in the sidebar may break at its parts (dots, slashes, underscores, a capital after a small
letter) and nowhere else.

The sidebar lists pages by qualified names (``kglightning.data.sources.embedded.builder``) and, on API pages, the
page's classes and functions (``HallucinationDetector``, ``attach_conformal_sets``); Benchmarks lists files
(``tools/bench/bench_proxy_step.py``). Such a word is often wider than the sidebar, and without a break opportunity a
browser cuts it where the line ends, inside a part. A ``<wbr>`` after each ``.``, ``/`` and ``_`` and before each
capital that follows a small letter lets it wrap between its parts (``docs/stylesheets/layout.css`` lets the labels
wrap at all; ``tools/check_layout.py`` fails on a label cut inside a part).

The module imports nothing from MkDocs, so ``tests/test_docs.py`` can call :func:`break_names`.
"""

from __future__ import annotations

import re
from typing import Any

#: a sidebar label: its span's content (text, and the symbol's ``<code>`` tag on API pages)
LABEL = re.compile(r'(<span class="md-ellipsis">)(.*?)(</span>)', flags=re.S)
#: where a long word may break: after a dot, slash or underscore, or between a small letter and a capital
PART = re.compile(r"(?<=[./_])(?=[^\s./_<&])|(?<=[a-z])(?=[A-Z])")
#: words shorter than this are left whole
LONG = 12


def _break_text(text: str) -> str:
    return re.sub(rf"[^\s<>&]{{{LONG},}}", lambda m: PART.sub("<wbr>", m.group(0)), text)


def break_names(html: str) -> str:
    """``html`` with a ``<wbr>`` between the parts of each long word of the sidebar's labels (outside tags).

    Example:
        >>> break_names('<span class="md-ellipsis"> kglightning.data.kg </span> kglightning.data.kg')
        '<span class="md-ellipsis"> kglightning.<wbr>data.<wbr>kg </span> kglightning.data.kg'
        >>> break_names('<span class="md-ellipsis"><code class="x"></code>&nbsp;HallucinationDetector</span>')
        '<span class="md-ellipsis"><code class="x"></code>&nbsp;Hallucination<wbr>Detector</span>'
        >>> break_names('<span class="md-ellipsis">attach_conformal_sets and Getting started</span>')
        '<span class="md-ellipsis">attach_<wbr>conformal_<wbr>sets and Getting started</span>'
    """

    def label(m: re.Match[str]) -> str:
        parts = re.split(r"(<[^>]*>|&\w+;)", m.group(2))  # tags and entities kept as they are
        body = "".join(p if p.startswith(("<", "&")) else _break_text(p) for p in parts)
        return m.group(1) + body + m.group(3)

    return LABEL.sub(label, html)


def on_post_page(output: str, page: Any, config: Any) -> str:
    return break_names(output)
