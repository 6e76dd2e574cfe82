"""A griffe extension that lets mkdocstrings read kglightning's docstrings as they are written.

The package's docstrings follow the Google style with a few Sphinx habits that griffe's Google parser does not
know. This extension rewrites each docstring's text (never the source files) before griffe parses it:

- ``Example:`` becomes ``Examples:``, so that ``>>>`` lines render as code (griffe only knows the plural; the
  singular would be an admonition whose doctest output Markdown reads as link references), and a doctest written
  outside an examples section is fenced as code for the same reason.
- An ``Args:`` entry that names several parameters at once (``topk, topk_e, cost_e: as G-Retriever``) becomes one
  entry per parameter with the same description, so that each name is checked against the signature.
- The first sentence of the first paragraph is put on the first line (:func:`summary_line`), which mkdocstrings
  shows as the object's summary in the member tables.
- Sphinx roles (``:class:`~kglightning.nn.KGGuard```, ``:func:`parse_answers```, ``:meth:`X.y```) become
  cross-references when the target is an object of the loaded package (looked up from the docstring's own scope
  outwards, as Sphinx does), and inline code otherwise. The references are *optional*: a target that is not
  rendered on any page stays plain code instead of failing the strict build.

:data:`KNOWN_ISSUES` lists docstrings that document parameters their object's signature does not have; each gets
the smallest rewrite that keeps the build strict, with the reason. Remove an entry once its docstring is fixed.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(class|func|meth|mod|data|attr|exc|obj|const):`(~?)([^`<>]+?)`")
SECTION = re.compile(r"^(\s*)(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters):\s*$")
SEVERAL = re.compile(r"^(\s*)((?:\*{0,2}[A-Za-z_]\w*)(?:,\s*\*{0,2}[A-Za-z_]\w*)+):\s(.*)$")

#: object path -> (pattern, replacement, why): applied to the docstring before parsing
#: (none at present: fix a docstring rather than add an entry)
KNOWN_ISSUES: dict[str, tuple[str, str, str]] = {}


def normalize_examples(text: str) -> str:
    """``Example:`` section headers become ``Examples:``; a doctest outside such a section is fenced as code."""
    lines = re.sub(r"^(\s*)Example:\s*$", r"\1Examples:", text, flags=re.M).split("\n")
    out: list[str] = []
    examples_indent: int | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if examples_indent is not None and line.strip() and indent <= examples_indent:
            examples_indent = None
        if re.match(r"^\s*Examples:\s*$", line):
            examples_indent = indent
        elif examples_indent is None and line.lstrip().startswith(">>>") and (not out or not out[-1].strip()):
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            pad = " " * indent
            out.extend([f"{pad}```pycon", *lines[i:j], f"{pad}```"])
            i = j
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def split_several(text: str) -> str:
    """Args entries naming several parameters become one entry per parameter."""
    lines = text.split("\n")
    out: list[str] = []
    section_indent: int | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        if (m := SECTION.match(line)) is not None:
            section_indent = len(m.group(1))
            out.append(line)
            i += 1
            continue
        if section_indent is not None and line.strip() and indent <= section_indent:
            section_indent = None
        m = SEVERAL.match(line) if section_indent is not None else None
        if m is None:
            out.append(line)
            i += 1
            continue
        body = [m.group(3)]
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
            if not lines[j].strip() and (j + 1 >= len(lines) or not lines[j + 1].strip()):
                break
            body.append(lines[j])
            j += 1
        for name in (n.strip() for n in m.group(2).split(",")):
            out.append(f"{m.group(1)}{name}: {body[0]}")
            out.extend(body[1:])
        i = j
    return "\n".join(out)


def _paths(obj: griffe.Object | griffe.Alias, seen: dict[str, Any]) -> None:
    seen[obj.path] = obj
    if isinstance(obj, griffe.Alias):
        return
    for member in obj.members.values():
        if member.path not in seen:
            _paths(member, seen)


def _scopes(obj: griffe.Object) -> list[str]:
    scopes = []
    node: Any = obj
    while node is not None:
        scopes.append(node.path)
        node = node.parent
    return scopes


def _target(path: str, objects: dict[str, Any]) -> str:
    obj = objects[path]
    if isinstance(obj, griffe.Alias):
        try:
            return obj.final_target.path
        except (griffe.AliasResolutionError, griffe.CyclicAliasError):
            return path
    return path


def resolve_roles(text: str, scopes: list[str], objects: dict[str, Any]) -> str:
    """Sphinx roles become optional cross-references (or inline code when the target is not in the package)."""

    def replace(m: re.Match) -> str:
        short, target = m.group(2) == "~", m.group(3).strip().removesuffix("()")
        shown = target.rsplit(".", 1)[-1] if short else target
        if m.group(1) in ("func", "meth"):
            shown += "()"
        for candidate in [target, *(f"{scope}.{target}" for scope in scopes)]:
            if candidate in objects:
                ident = html.escape(_target(candidate, objects), quote=True)
                return f'<autoref identifier="{ident}" optional><code>{html.escape(shown)}</code></autoref>'
        return f"`{shown}`"

    return ROLE.sub(replace, text)


#: words after which a period does not end a sentence (matched as whole words, case-insensitively)
_NOT_AN_END = re.compile(r"\b(?:e\.g|i\.e|etc|vs|cf|approx|resp|incl|eq|eqs|fig|al|no|sec|ref|[A-Z])$", re.I)
#: a line that begins a Markdown or reST block: a paragraph holding one is not prose to rejoin
_BLOCK = re.compile(r"^\s*(?:>>>|```|[-*+|#>]|!!!|\?\?\?|\.\.|\d+[.)]\s)")


def summary_line(text: str) -> str:
    r"""The first paragraph's first sentence on the docstring's first line (the rest of the paragraph on the next):
    mkdocstrings shows a docstring's first *line* as its summary in the member tables, and a sentence wrapped at the
    line length would stop mid-way there. Markdown renders the paragraph the same either way.

    A sentence ends at a period followed by a space and a capital letter, outside code and brackets, and not after
    an abbreviation (``e.g.``, ``Eq.``, ``et al.``, an initial). A first paragraph with a Markdown or reST block
    (a heading, list, admonition, quote, table or code), an indented line or a hard line break is left as it is.

    Example:
        >>> summary_line("Pick the answers whose\nscores pass. Then rank\nthem.\n\nMore.")
        'Pick the answers whose scores pass.\nThen rank them.\n\nMore.'
    """
    head, sep, rest = text.partition("\n\n")
    lines = head.split("\n")
    if len(lines) < 2 or any(_BLOCK.match(line) or line[:1].isspace() or line.endswith("  ") for line in lines):
        return text  # one line already, or not plain prose
    para = " ".join(line.strip() for line in lines)
    depth, quoted = 0, False
    for i, ch in enumerate(para):
        if ch == "`":
            if para[i + 1 : i + 2] != "`":  # a run of backticks opens or closes code once
                quoted = not quoted
        elif not quoted and ch in "([{":
            depth += 1
        elif not quoted and ch in ")]}":
            depth = max(depth - 1, 0)
        elif ch == "." and not quoted and depth == 0 and para[i + 1 : i + 2] == " ":
            following = para[i + 2 : i + 3]
            if (following.isupper() or following in "`*:") and following and not _NOT_AN_END.search(para[:i]):
                para = para[: i + 1] + "\n" + para[i + 2 :]
                break
    return para + sep + rest


class KGLightningDocstrings(griffe.Extension):
    """Rewrites every docstring of the loaded package as the module docstring describes."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        objects: dict[str, Any] = {}
        _paths(pkg, objects)
        for path, obj in objects.items():
            if isinstance(obj, griffe.Alias) or obj.docstring is None:
                continue
            text = obj.docstring.value
            if path in KNOWN_ISSUES:
                pattern, replacement, _why = KNOWN_ISSUES[path]
                text = re.sub(pattern, replacement, text, count=1, flags=re.M | re.S)
            text = summary_line(split_several(normalize_examples(text)))
            scopes = _scopes(obj) if obj.is_class else _scopes(obj)[1:]
            obj.docstring.value = resolve_roles(text, scopes, objects)
