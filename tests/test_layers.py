"""The package's layers only point down, and no two files import each other.

Every ``kglightning`` import of every module is read with :mod:`ast` (at module level or inside a function; imports
under ``if TYPE_CHECKING:`` are annotations and do not count). A package may import from its own files and from
packages on lower floors, never from its floor or above (see docs/architecture.md, "Architecture and subclassing").
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kglightning"

#: floor of each top-level part of kglightning; a part imports only from lower floors (or itself)
FLOORS = {
    "data": 1,
    "metrics": 1,
    "nn": 1,
    "testing": 1,
    "evidence": 2,
    "llm": 3,
    "retrieval": 3,
    "baselines": 3,
    "datamodules": 4,
    "conformal": 4,
    "modules": 5,
    "callbacks": 5,
    "pipelines": 6,
    "evaluate": 7,
    "serve": 7,  # the detector behind HTTP (LitServe)
    "cli": 8,
    "__main__": 9,
    "__init__": 0,  # the package root holds only the version
    "fileio": 0,  # atomic output files; imports nothing of kglightning
    "lazy": 0,  # package exports imported on first use; imports nothing of kglightning
    "threads": 0,  # torch's thread count and wait policy; imports nothing of kglightning
    "help_format": 0,  # --help that shows defaults; imports nothing of kglightning
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(source: str, module: str, is_pkg: bool = False) -> set[str]:
    """Every kglightning module that ``source`` (the text of ``module``) imports at run time (``from pkg import sub``
    counts as ``pkg.sub``)."""
    tree = ast.parse(source)
    skip = {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node) for n in ast.walk(node)
    }
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("kglightning"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("kglightning"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                out.add(sub if _exists(sub) else target)
    return out


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _graph() -> dict[str, set[str]]:
    return {
        _module_name(p): _imports(p.read_text(encoding="utf-8"), _module_name(p), p.name == "__init__.py")
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def test_every_part_has_a_floor():
    parts = {_part(m) for m in _graph()}
    missing = sorted(parts - set(FLOORS))
    assert not missing, f"give these a floor in FLOORS (and in docs/architecture.md): {missing}"


def test_imports_only_point_down():
    upward = [
        f"{src} -> {dst} (floor {FLOORS[_part(src)]} -> {FLOORS[_part(dst)]})"
        for src, targets in _graph().items()
        for dst in sorted(targets)
        if _part(src) != _part(dst) and FLOORS[_part(dst)] >= FLOORS[_part(src)]
    ]
    assert not upward, "imports that do not point to a lower floor:\n" + "\n".join(upward)


def test_no_import_cycle_between_files():
    graph = _graph()
    # a package's __init__ re-exports its files; a file importing its own package's names is an edge to a sibling
    # only through that __init__, which is not a cycle between files
    edges = {
        src: {dst for dst in targets if dst != src and not (dst in graph and src.startswith(dst + "."))}
        for src, targets in graph.items()
    }
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from kglightning.llm.parsing import parse_answers\n", {"kglightning.llm.parsing"}),
        ("from kglightning.data import kg_paths\n", {"kglightning.data.kg_paths"}),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kglightning.llm import prompts\n", set()),
        ("def f():\n    import kglightning.pipelines.uag\n", {"kglightning.pipelines.uag"}),
    ],
)
def test_the_import_reader(source, expected):
    assert _imports(source, "kglightning.data.probe") == expected
    assert _imports("from . import kg\nfrom .kg import KGIndex\n", "kglightning.data", is_pkg=True) == {
        "kglightning.data.kg"
    }
