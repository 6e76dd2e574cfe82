"""kglightning.lazy: package exports imported on first use."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from kglightning.lazy import declared_exports, lazy_exports

ROOT = Path(__file__).resolve().parents[1]
LAZY_PACKAGES = ["kglightning.metrics", "kglightning.conformal", "kglightning.conformal.functional",
                 "kglightning.retrieval"]  # fmt: skip


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_every_declared_export_resolves_and_all_lists_exactly_them(name):
    package = importlib.import_module(name)
    declared = declared_exports(package.__file__)
    assert sorted(package.__all__) == sorted(declared)
    for export, (module, attribute) in declared.items():
        assert getattr(package, export) is getattr(importlib.import_module(module), attribute)
    assert set(declared) <= set(dir(package))
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        package.nothing_here  # noqa: B018


def test_importing_a_lazy_package_imports_none_of_its_exports():
    code = ("import sys, kglightning.metrics, kglightning.conformal, kglightning.retrieval; "
            "print(sorted(m for m in ('torch', 'torchmetrics', 'faiss', 'kglightning.metrics.calibration') "
            "if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_a_package_without_declared_exports_is_refused(tmp_path):
    init = tmp_path / "__init__.py"
    init.write_text("from os import path\n", encoding="utf-8")  # not under TYPE_CHECKING: nothing is declared
    with pytest.raises(ValueError, match="declares no export"):
        lazy_exports("somewhere", init)
    init.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from os.path import join as j\n")
    assert declared_exports(init) == {"j": ("os.path", "join")}
