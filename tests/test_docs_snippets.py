"""The Python blocks of the pages listed here run as they stand, and what they print is what their comments say.

A block's ``print(...)  # expected`` lines are checked: each printed line must equal the comment of the print call
that wrote it (the text after ``# `` up to the first ``:``, when there is one, as the comment explains after it).
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ["docs/methods/conformal.md"]
BLOCK = re.compile(r"```python\n(.*?)```", flags=re.S)
PRINT = re.compile(r"^print\(.*\)\s+#\s*(.*)$")


@pytest.mark.parametrize("page", PAGES)
def test_the_python_blocks_of_a_page_run_and_print_what_their_comments_say(page):
    blocks = BLOCK.findall((ROOT / page).read_text(encoding="utf-8"))
    assert blocks, f"{page} has no python block"
    for block in blocks:
        expected = [m.group(1).split(":", 1)[0].strip() for m in map(PRINT.match, block.splitlines()) if m]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(block, page, "exec"), {"__name__": "__docs__"})
        assert out.getvalue().splitlines() == expected
