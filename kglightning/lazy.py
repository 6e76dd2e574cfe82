"""Package exports imported on first use (PEP 562), so that importing a package costs only what is used of it.

A package's ``__init__`` names its exports in an ``if TYPE_CHECKING:`` block of ``from ... import ...`` lines (what
type checkers, IDEs and the API docs read) and hands its own file to :func:`lazy_exports`, which reads that block:

.. code-block:: python

    from typing import TYPE_CHECKING

    from kglightning.lazy import lazy_exports

    if TYPE_CHECKING:
        from kglightning.metrics.calibration import ExpectedCalibrationError

    __getattr__, __dir__ = lazy_exports(__name__, __file__)
    __all__ = ["ExpectedCalibrationError"]

``from kglightning.metrics import ExpectedCalibrationError`` then imports ``kglightning.metrics.calibration`` (and
torch with it) at that moment, not when ``kglightning.metrics.evaluation`` is imported by a file command that
needs no torch (:mod:`kglightning.cli.entry`). Floor 0: imports nothing of kglightning.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def declared_exports(init_file: str | Path) -> dict[str, tuple[str, str]]:
    """``{name: (module, attribute)}`` of the ``from module import attribute [as name]`` lines in the top-level
    ``if TYPE_CHECKING:`` blocks of ``init_file`` (a package's ``__init__.py``); modules are absolute, and
    ``from package import *`` takes that package's own declared exports."""
    tree = ast.parse(Path(init_file).read_text(encoding="utf-8"), filename=str(init_file))
    exports: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.If) and _is_type_checking(node.test)):
            continue
        for line in node.body:
            if isinstance(line, ast.ImportFrom) and line.module and line.level == 0:
                for alias in line.names:
                    if alias.name == "*":  # another lazy package's exports, re-exported
                        spec = importlib.util.find_spec(line.module)
                        if spec is None or spec.origin is None:
                            raise ValueError(f"{init_file}: cannot find {line.module} for `import *`")
                        exports.update(declared_exports(spec.origin))
                    else:
                        exports[alias.asname or alias.name] = (line.module, alias.name)
    return exports


def lazy_exports(package: str, init_file: str | Path) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose exports :func:`declared_exports` reads from its
    ``init_file``. An export is imported on first access and kept on the package, so later accesses are plain
    attribute lookups.

    Raises:
        ValueError: ``init_file`` declares no export.
    """
    exports = declared_exports(init_file)
    if not exports:
        raise ValueError(f"{init_file} declares no export in an `if TYPE_CHECKING:` block of `from ... import ...`")

    def __getattr__(name: str) -> Any:
        where = exports.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[0]), where[1])
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
