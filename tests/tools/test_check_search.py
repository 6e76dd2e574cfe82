"""tools/check_search.py: the site's own search, run in headless Chromium (skipped where none is installed)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
_spec = importlib.util.spec_from_file_location("check_search", ROOT / "tools/check_search.py")
search = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(search)


def _site(folder: Path, boosted: str) -> Path:
    """A three-page Material site with two pages that match alike, ``boosted`` given a higher rank in search."""
    pages = {
        "index.md": "# Home\n\nhello\n",
        "tutorials/flag.md": "# Answers detector: tutorial\n\nTrain the detector on your answers.\n",
        "api/detector.md": "# Answers detector: reference\n\nTrain the detector on your answers.\n",
    }
    for name, text in pages.items():
        path = folder / "docs" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(("---\nsearch:\n  boost: 5\n---\n\n" if name == boosted else "") + text)
    (folder / "mkdocs.yml").write_text("site_name: mini\ntheme:\n  name: material\nplugins:\n  - search\n")
    subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "--site-dir", str(folder / "site")], cwd=folder,
                   check=True, env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))  # fmt: skip
    return folder / "site"


def test_a_first_result_elsewhere_is_named():
    assert search.misplaced("q", [("Flag", "/tutorials/flag/")], ("tutorials/",)) is None
    assert search.misplaced("q", [], ("tutorials/",)).startswith("q: no result")
    found = search.misplaced("q", [("Detector", "/api/detector/"), ("Flag", "/tutorials/flag/")], ("tutorials/",))
    assert found == "q: first 'Detector' (/api/detector/), not a page under tutorials/"


@pytest.mark.skipif(search.find_browser() is None, reason="no Chromium on the PATH (apt-get install chromium)")
def test_the_check_reads_the_sites_real_ranking(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(search, "QUERIES", {"answers detector": ("tutorials/",)})
    tutorial_first = _site(tmp_path / "a", boosted="tutorials/flag.md")
    assert search.check(tutorial_first, search.find_browser()) == []
    api_first = _site(tmp_path / "b", boosted="api/detector.md")
    problems = search.check(api_first, search.find_browser())
    assert problems == ["answers detector: first 'Answers detector: reference' (/api/detector/), not a page under "
                        "tutorials/"]  # fmt: skip
    assert search.main([str(api_first)]) == 1 and "1 problems" in capsys.readouterr().out


def test_without_a_browser_the_check_is_skipped_unless_required(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(search, "find_browser", lambda: None)
    assert search.main([str(tmp_path)]) == 0 and "skipped" in capsys.readouterr().out
    assert search.main([str(tmp_path), "--require"]) == 1
