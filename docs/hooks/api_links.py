"""MkDocs hook: a ``kglightning.…`` name in inline code on a prose page links to its place in the API reference.

The method pages, guides and tutorials name classes, functions and modules as inline code
(```kglightning.modules.HallucinationDetector```). This hook rewrites each such span, outside fenced code and
outside existing links, as an autorefs cross-reference, ``[`kglightning.modules.HallucinationDetector`][id]``,
where ``id`` is where the API reference renders the object: the module that *defines* it (a re-exported class is
rendered on its defining module's page), or the module's own page for a module. A name that does not import is
left as it is and listed by :func:`unresolved`; the strict build fails on an ``id`` the reference does not render.

The module imports nothing from MkDocs, so ``tests/test_docs.py`` can call :func:`link_names` and :func:`target`.
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

#: pages (paths relative to docs/, by prefix) left alone: the API reference links its own names
SKIP = ("api/",)
NAME = re.compile(r"kglightning(?:\.[A-Za-z_]\w*)+")
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")  # an inline code span: backticks, closed by as many
FENCE = re.compile(r"^\s*(`{3,}|~{3,})(.*)$")
_unresolved: set[str] = set()


def target(name: str) -> str | None:
    """The identifier under which the API reference renders ``name`` (a dotted ``kglightning`` path), or ``None``
    when it does not import."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        rest = parts[cut:]
        if not rest:
            return name
        for attr in rest:
            if not hasattr(obj, attr):
                return None
            obj = getattr(obj, attr)
        if inspect.ismodule(obj):
            return obj.__name__
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if isinstance(module, str) and module.startswith("kglightning") and isinstance(qualname, str):
            return f"{module}.{qualname}"
        return ".".join(parts[:cut])  # a constant or an instance: its module's page
    return None


def link_names(markdown: str) -> str:
    """``markdown`` with every inline-code ``kglightning`` name outside fenced code and outside link text turned into
    a cross-reference (names that do not import are kept as code and remembered for :func:`unresolved`)."""
    out, fence = [], None  # fence: the open fence's character and length
    for line in markdown.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence = (m.group(1)[0], len(m.group(1)))
        elif fence is not None and m and _closes(m, fence):
            fence = None
        elif fence is None:
            line = _link_line(line)
        out.append(line)
    return "\n".join(out)


def _closes(m: re.Match, fence: tuple[str, int]) -> bool:
    """Whether a fence line closes the open ``fence``: the same character, at least as many, nothing after."""
    return m.group(1)[0] == fence[0] and len(m.group(1)) >= fence[1] and not m.group(2).strip()


def _link_line(line: str) -> str:
    parts, at = [], 0
    for m in SPAN.finditer(line):
        before, code, name = line[: m.start()], m.group(0), m.group(2)
        in_link_text = before.count("[") > before.count("]")
        if len(m.group(1)) == 1 and NAME.fullmatch(name) and not in_link_text and line[m.end() : m.end() + 1] != "(":
            ident = target(name)
            if ident is None:
                _unresolved.add(name)
            else:
                code = f"[{code}][{ident}]"
        parts += [line[at : m.start()], code]
        at = m.end()
    return "".join([*parts, line[at:]])


def unresolved() -> list[str]:
    """The names :func:`link_names` met that do not import, sorted."""
    return sorted(_unresolved)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if page.file.src_uri.startswith(SKIP):
        return markdown
    return link_names(markdown)
