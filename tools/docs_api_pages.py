"""Split the API reference into one page per module, and keep the site's navigation in step with the pages.

A package page ``docs/api/<page>.md`` holds its introduction (the text before its first ``:::`` directive), the
package's own docstring and a table of its modules; each module has a page ``docs/api/<page>/<name>.md`` whose one
directive renders it with the module path as the page's title. The navigation of ``mkdocs.yml``, between the lines
``# api-nav: start`` and ``# api-nav: end``, lists every package page and its *public* module pages, labelled by
their qualified names; the other modules (internals) keep their pages, linked from their package page's table of
internals and found by the search box with a lower rank, but stay out of the navigation (``not_in_nav``).

A module is public when a package of ``kglightning`` exports something it defines (its ``__all__``), when a config in
``configs/`` or a guide (``docs/``, the README) names it or something in it, when it is a package holding such a
module, or when it is a top-level module with an ``__all__`` of its own.

    python tools/docs_api_pages.py           # write the pages and the navigation from the directives found
    python tools/docs_api_pages.py --check   # exit 1, naming what differs, when they are not what it would write

The directives found are those of the package pages and of the module pages already there, so a new module gets its
page from a ``::: kglightning.x.y`` line added to its package page (``tests/test_docs.py`` says which are missing).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"
MKDOCS = ROOT / "mkdocs.yml"
DIRECTIVE = re.compile(r"^::: *([\w.]+)[ \t]*\n((?:[ \t]+.*\n?)*)", flags=re.M)
NAV_START, NAV_END = "# api-nav: start", "# api-nav: end"
MODULES_HEADING = "## Modules"
INTERNALS_HEADING = "## Internals"


def front_matter(module: str, public: bool) -> str:
    """A module page's front matter: its title (the qualified name, also where the navigation does not list the page:
    browser tabs and search results show it), and for an internal module a lower rank in the search box."""
    return f"---\ntitle: {module}\n" + ("" if public else "search:\n  boost: 0.5\n") + "---\n\n"


@functools.cache
def public_modules() -> frozenset[str]:
    """The modules that define what a package exports or a config names (see the module docstring)."""
    import pkgutil

    import kglightning

    found: set[str] = set()
    for info in pkgutil.walk_packages(kglightning.__path__, "kglightning."):
        if info.ispkg:
            package = importlib.import_module(info.name)
            for name in getattr(package, "__all__", ()):
                obj = getattr(package, name, None)
                found.add(obj.__name__ if isinstance(obj, type(package)) else getattr(obj, "__module__", None) or "")
    prose = [p.read_text(encoding="utf-8") for p in (ROOT / "docs").rglob("*.md") if API not in p.parents]
    prose.append((ROOT / "README.md").read_text(encoding="utf-8"))
    configs = [c.read_text(encoding="utf-8") for c in (ROOT / "configs").rglob("*.yaml")]
    for text in configs + prose:
        for path in re.findall(r"\bkglightning(?:\.\w+)+", text):
            found.update(m for m in (path, path.rsplit(".", 1)[0]) if _imports(m))
    for text in prose:  # from kglightning.x import y
        found.update(m for m in re.findall(r"^\s*from (kglightning(?:\.\w+)+) import", text, flags=re.M) if _imports(m))
    return frozenset(found - {""})


def is_public(module: str) -> bool:
    """Whether ``module``'s page belongs in the navigation (see the module docstring)."""
    found = public_modules()
    if module in found or any(m.startswith(module + ".") for m in found):
        return True
    return module.count(".") == 1 and hasattr(importlib.import_module(module), "__all__")


def _short(module: str, package: str | None) -> str:
    """``module``'s name under its page's package (its page file's stem), or the whole path."""
    return module[len(package) + 1 :] if package and module.startswith(package + ".") else module


def _cell(text: str) -> str:
    """``text`` for a Markdown table cell: its reST roles written as code, its pipes escaped."""
    text = _hook().ROLE.sub(lambda m: f"`{m.group(3).rsplit('.', 1)[-1] if m.group(2) else m.group(3)}`", text)
    return text.replace("|", "\\|")


def _summary(module: str) -> str:
    """The first sentence of ``module``'s docstring (as the docs hook finds it), on one line, for the package page's
    table, its reST roles written as code."""
    doc = (importlib.import_module(module).__doc__ or "").strip()
    return _cell(_hook().summary_line(doc.split("\n\n")[0]).split("\n")[0].strip())


@functools.cache
def _hook() -> Any:
    """``docs/hooks/griffe_docstrings.py``, loaded from its file."""
    spec = importlib.util.spec_from_file_location("griffe_docstrings", ROOT / "docs" / "hooks" / "griffe_docstrings.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _directive_options(block: str) -> list[str]:
    """A directive's options (its YAML block parsed, whatever its indentation) as option lines indented six spaces,
    ``heading_level`` left out (a page sets its own)."""
    import yaml

    options = ((yaml.safe_load(block) if block.strip() else None) or {}).get("options") or {}
    return [f"      {key}: {json.dumps(value)}" for key, value in options.items() if key != "heading_level"]


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def collect() -> dict[str, tuple[str, list[tuple[str, list[str]]]]]:
    """``{page: (introduction, [(module, option lines), ...])}`` from the package pages and their module pages."""
    pages: dict[str, tuple[str, list[tuple[str, list[str]]]]] = {}
    for page in sorted(API.glob("*.md")):
        if page.stem == "index":
            continue
        text = page.read_text(encoding="utf-8")
        intro_end = min(i for i in (text.find("\n:::"), text.find(f"\n{MODULES_HEADING}"), len(text)) if i >= 0)
        intro = text[:intro_end].rstrip() + "\n"
        found = [(m.group(1), _directive_options(m.group(2))) for m in DIRECTIVE.finditer(text)]
        for sub in sorted((API / page.stem).glob("*.md")) if (API / page.stem).is_dir() else []:
            found += [(m.group(1), _directive_options(m.group(2))) for m in DIRECTIVE.finditer(sub.read_text("utf-8"))]
        seen: dict[str, list[str]] = {}
        for module, options in found:
            if _imports(module):  # a removed module's page is left out, and so removed (or reported by --check)
                seen.setdefault(module, options)
        pages[page.stem] = (intro, sorted(seen.items(), key=lambda kv: (kv[0].count(".") > 1, kv[0])))
    return pages


def _package(page: str, modules: list[tuple[str, list[str]]]) -> str | None:
    """The package a page is about: its one directive with ``members: false`` whose path is shortest, if any."""
    own = [m for m, options in modules if any(line.strip() == "members: false" for line in options)]
    return min(own, key=len) if own else None


def _options(lines: list[str], heading_level: int) -> str:
    """A directive's ``options:`` block: ``heading_level``, then the option lines as found (indented six spaces)."""
    return "    options:\n" + "\n".join([f"      heading_level: {heading_level}", *lines]) + "\n"


def render(pages: dict[str, tuple[str, list[tuple[str, list[str]]]]]) -> dict[Path, str]:
    """Every page's text, by path."""
    out: dict[Path, str] = {}
    for page, (intro, modules) in pages.items():
        package = _package(page, modules)
        rows: dict[bool, list[str]] = {True: [], False: []}
        for module, options in modules:
            if module == package:
                continue
            name = _short(module, package)
            path = API / page / f"{name}.md"
            public = is_public(module)
            back = "" if public else f"An internal module of [{package or page}](../{page}.md#internals).\n\n"
            out[path] = front_matter(module, public) + back + f"::: {module}\n{_options(options, 1)}"
            rows[public].append(f"| [`{name}`]({page}/{name}.md) | {_summary(module)} |")
        text = intro
        if package:
            text += f"\n::: {package}\n{_options(dict(modules)[package], 2)}"
        table = "\n\n| module | what it holds |\n|---|---|\n"
        text += MODULES_HEADING.join(["\n", table]) + "\n".join(rows[True]) + "\n"
        if rows[False]:
            text += (f"\n{INTERNALS_HEADING}\n\nWhat the modules above are built from. Their pages are not in the "
                     "navigation, and they may change between versions without notice." + table
                     + "\n".join(rows[False]) + "\n")  # fmt: skip
        out[API / f"{page}.md"] = text
    return out


def nav(pages: dict[str, tuple[str, list[tuple[str, list[str]]]]], indent: str) -> str:
    """The API part of the navigation: each package page, then its public module pages (labelled by their qualified
    names), under the package's label."""
    labels = _labels()
    for page in pages:  # a new package page: labelled by its title, after the others
        if page not in labels:
            title = re.search(r"^# (.+)$", pages[page][0], flags=re.M)
            labels[page] = title.group(1).strip() if title else page
    lines = [f"{indent}- api/index.md"]
    for page in labels:
        if page not in pages:
            continue
        intro, modules = pages[page]
        package = _package(page, modules)
        lines.append(f"{indent}- {labels[page]}:")
        lines.append(f"{indent}    - api/{page}.md")
        for module, _ in modules:
            if module != package and is_public(module):
                name = _short(module, package)
                lines.append(f"{indent}    - {module}: api/{page}/{name}.md")
    return "\n".join(lines) + "\n"


def _labels() -> dict[str, str]:
    """``{page: label}`` in the navigation's order, read from the current navigation (``- Label: api/page.md`` or
    a section ``- Label:`` whose first entry is ``api/page.md``)."""
    text = MKDOCS.read_text(encoding="utf-8")
    block = text[text.index(NAV_START) : text.index(NAV_END)]
    labels: dict[str, str] = {}
    for m in re.finditer(r"- ([^:\n]+):\s*(?:api/(\w+)\.md|\n\s*- api/(\w+)\.md)", block):
        labels[m.group(2) or m.group(3)] = m.group(1).strip()
    return labels


INDEX = API / "index.md"
INDEX_START, INDEX_END = "<!-- api-index: start (written by tools/docs_api_pages.py) -->", "<!-- api-index: end -->"
#: the packages of the index by task, in the order a user meets them
TASKS = ("datamodules", "data", "modules", "nn", "callbacks", "conformal", "metrics", "llm", "evidence", "retrieval",
         "baselines", "pipelines", "serve", "cli", "testing")  # fmt: skip


def _object_summary(obj: Any) -> str:
    """The first sentence of an object's docstring, on one line, for a table cell."""
    hook = _hook()
    doc = (getattr(obj, "__doc__", None) or "").strip()
    if not doc or doc == (type(obj).__doc__ or "").strip():
        return ""
    lines = hook.summary_line(doc.split("\n\n")[0]).split("\n")
    # the first line, or (a paragraph the hook left as it was) the lines up to the first that ends a sentence
    end = next((i for i, line in enumerate(lines) if line.rstrip().endswith((".", ":", ")"))), 0)
    first = " ".join(line.strip() for line in lines[: end + 1]).rstrip(":")
    first = re.split(r"(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z])", first, maxsplit=1)[0].rstrip(".") + "."
    # a table cell's "|" must be escaped, and an escape inside a code span shows as written: such a span goes plain
    return _cell(re.sub(r"``?([^`]*\|[^`]*)``?", lambda m: m.group(1), first))


def task_index() -> str:
    """The index by task: per package (under its label in the navigation), each class and function it exports,
    linked to where the reference renders it, with its summary."""
    labels = _labels()
    parts = []
    for page in TASKS:
        package = importlib.import_module(f"kglightning.{page}")
        rows = []
        for name in getattr(package, "__all__", ()):
            obj = getattr(package, name)
            if isinstance(obj, type(package)) or not callable(obj) or not obj.__module__.startswith("kglightning."):
                continue  # a subpackage, a constant, or a library's class passed on (torchmetrics')
            kind = "class" if isinstance(obj, type) else "function"
            rows.append(f"| [`{name}`][{obj.__module__}.{obj.__qualname__}] | {kind} | {_object_summary(obj)} |")
        if rows:
            parts.append(f"### {labels.get(page, page)}\n\n`{package.__name__}`: [its page]({page}.md)\n\n"
                         "| name | kind | what it does |\n|---|---|---|\n" + "\n".join(rows) + "\n")  # fmt: skip
    return "\n".join(parts)


def _with_index(text: str) -> str:
    """``docs/api/index.md``'s text with the index by task between its markers."""
    start, end = text.index(INDEX_START), text.index(INDEX_END)
    return text[: start + len(INDEX_START)] + "\n\n" + task_index() + "\n" + text[end:]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 when something differs")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    pages = collect()
    files = render(pages)
    text = MKDOCS.read_text(encoding="utf-8")
    start, end = text.index(NAV_START), text.index(NAV_END)
    indent = " " * (len(text[:end].rsplit("\n", 1)[1]))
    new_text = text[: text.index("\n", start) + 1] + nav(pages, indent) + text[end - len(indent) :]
    files[INDEX] = _with_index(INDEX.read_text(encoding="utf-8"))
    stale = [p for p in API.glob("*/*.md") if p not in files]
    differ = [p for p, t in files.items() if not p.is_file() or p.read_text(encoding="utf-8") != t]
    if args.check:
        problems = [*map(str, differ), *(f"{p} (no module of that name)" for p in stale)]
        problems += ["mkdocs.yml's API navigation"] if new_text != text else []
        if problems:
            print("out of date (run python tools/docs_api_pages.py):\n" + "\n".join(problems))
            return 1
        return 0
    for path in differ:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path], encoding="utf-8")
    for path in stale:
        path.unlink()
    MKDOCS.write_text(new_text, encoding="utf-8")
    print(f"{len(files)} pages ({len(differ)} written, {len(stale)} removed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
