"""tools/docs_inventories.py: the offline inventories that link the API pages' types into other projects' docs."""

from __future__ import annotations

import importlib
import importlib.util
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("docs_inventories", ROOT / "tools" / "docs_inventories.py")
inv = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(inv)


def _entries(data: bytes) -> dict[str, str]:
    """name -> uri of a Sphinx inventory (format 2), read as Sphinx and mkdocstrings read it."""
    lines = data.split(b"\n", 4)
    assert lines[0] == b"# Sphinx inventory version 2" and b"zlib" in lines[3]
    out = {}
    for line in zlib.decompress(lines[4]).decode().splitlines():
        name, role, priority, uri, display = line.split(" ", 4)
        assert role == "py:class" and priority == "1" and display == "-"
        out[name] = uri
    return out


def test_the_inventory_files_are_current_and_hold_every_mapped_name():
    assert inv.main(["--check"]) == 0
    for project, (base, pages) in inv.PAGES.items():
        assert base.startswith("https://") and base.endswith("/")
        assert _entries((inv.OUT / f"{project}.inv").read_bytes()) == pages


def test_a_changed_inventory_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(inv, "OUT", tmp_path)
    assert inv.main([]) == 0 and inv.main(["--check"]) == 0
    (tmp_path / "numpy.inv").write_bytes(inv.inventory("numpy", {"numpy.ndarray": "elsewhere.html"}))
    assert inv.main(["--check"]) == 1 and "numpy.inv" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted({n for _, pages in inv.PAGES.values() for n in pages} | set(inv.UNMAPPED)))
def test_every_name_is_an_object_of_the_installed_library(name):
    module, _, attr = name.rpartition(".")
    assert hasattr(importlib.import_module(module), attr), f"{name} does not exist: its link would lead nowhere"


def test_every_external_type_in_the_api_is_mapped_or_said_to_have_no_page():
    assert inv.missing() == []  # a new type in a signature: add its page to PAGES, or it to UNMAPPED with why
