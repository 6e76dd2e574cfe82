"""tools/check_layout.py: pages measured in headless Chromium (skipped where none is installed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("check_layout", ROOT / "tools/check_layout.py")
layout = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(layout)

WIDE = 'style="min-width:3000px"'


def _page(folder: Path, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "index.html").write_text(f"<html><body><article style='width:700px'>{body}</article></body></html>")


@pytest.mark.skipif(layout.find_browser() is None, reason="no Chromium on the PATH (apt-get install chromium)")
def test_tables_and_code_wider_than_the_column_are_found_whether_cut_off_or_scrolling(tmp_path, capsys):
    _page(tmp_path / "wide", f"<table><tr><td {WIDE}>cut off</td></tr></table>")
    _page(tmp_path / "scrolls", f"<div style='overflow-x:auto'><table><tr><td {WIDE}>scrolls</td></tr></table></div>")
    _page(tmp_path / "hidden", f"<pre style='overflow-x:hidden;width:200px'>{'x' * 400}</pre><pre>fits</pre>")
    long_line = "python -m kglightning fit " * 40
    _page(tmp_path / "code", f"<pre><code style='overflow-x:auto;display:block'>{long_line}</code></pre>")
    _page(tmp_path / "wraps", f"<pre><code style='white-space:pre-wrap;display:block'>{long_line}</code></pre>")
    _page(tmp_path / "fits", "<table><tr><td>a</td><td>b</td></tr></table><pre><code>short</code></pre>")
    pad = "<code style='padding:0 30px;box-decoration-break:clone;-webkit-box-decoration-break:clone'>"
    _page(tmp_path / "inline", "<p>" + "word " * 40 + pad + "x" * 300 + "</code></p>")  # its padding past the edge
    _page(tmp_path / "inline-fits", "<p>" + "word " * 40 + "<code>" + "x " * 300 + "</code></p>")
    side = (
        "<div class='md-sidebar'><span class='md-ellipsis' style='display:block;width:90px;overflow-wrap:break-word'>"
    )
    _page(tmp_path / "label-cut", side + "HallucinationDetectorOfLongName</span></div>")  # cut where the line ends
    _page(tmp_path / "label-parts", side + "Hallucination<wbr>Detector<wbr>Of<wbr>Long<wbr>Name and words</span></div>")
    _page(tmp_path / "api" / "tall", "<div style='height:25000px'>long</div>")
    _page(tmp_path / "tall", "<div style='height:25000px'>a long page that is not an API page</div>")
    heights: dict[str, int] = {}
    problems = layout.check(tmp_path, layout.find_browser(), 20_000, heights)
    assert len(problems) == 7, problems
    for page, element in (("wide", "table"), ("scrolls", "table"), ("hidden", "pre"), ("code", "pre")):
        assert any(p.startswith(f"{page}: {element} ") and " px wide in 70" in p for p in problems), (page, problems)
    assert not any(p.startswith(("wraps:", "fits:", "inline-fits:", "label-parts:")) for p in problems)
    assert any(p.startswith("label-cut: sidebar label cut in a word") for p in problems), problems
    assert any(p.startswith("inline: code (inline) ") for p in problems), problems
    assert any(p.startswith("api/tall: ") and "px tall" in p for p in problems)
    assert heights["tall"] > 25_000 and heights["scrolls"] <= 1_000  # a short page: the viewport
    assert layout.main([str(tmp_path)]) == 1 and "7 problems" in capsys.readouterr().out


def test_without_a_browser_the_check_is_skipped_with_the_reason_unless_required(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(layout.shutil, "which", lambda name: None)
    assert layout.main([str(tmp_path)]) == 0
    assert "skipped: no Chromium" in capsys.readouterr().out
    assert layout.main([str(tmp_path), "--require"]) == 1


@pytest.mark.skipif(layout.find_browser() is None, reason="no Chromium on the PATH (apt-get install chromium)")
def test_a_browser_that_answers_nothing_times_out_instead_of_hanging():
    browser = layout.Browser(layout.find_browser())
    try:
        browser.timeout = 0.5
        browser._buffer = b""
        with pytest.raises(TimeoutError, match="sent nothing"):
            next(browser._messages())  # no command sent: no reply comes
    finally:
        browser.close()
