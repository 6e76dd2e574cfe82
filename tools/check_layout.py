"""Check the built documentation site as a reader sees it: every page in headless Chromium at 1280 px.

A table, code block or API signature *overflows* when it is wider than the page's text column: it runs past the
column's right edge, or it (or a box around it) scrolls sideways, or it is cut off by a box that hides what does not
fit; inline code overflows when a line of it runs past the column's edge; a sidebar label is cut when a line of it ends
inside a word (not at a blank, a hyphen or a break ``docs/hooks/nav_breaks.py`` put there). A reader would have to
scroll sideways or would miss the end of a line (issue 59). An API page (``api/``) is *too tall* above ``--max-api-height`` pixels.

    mkdocs build --strict --site-dir site && python tools/check_layout.py site

It drives one Chromium through the DevTools protocol on a pipe (``--remote-debugging-pipe``), with no other
dependency. Without a Chromium on the ``PATH`` (``chromium``, ``chromium-browser``, ``google-chrome``) it says so and
exits 0, or 1 with ``--require``. Exits 1 when a page has an overflowing element or an API page is too tall.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
WIDTH = 1280

# what a reader would have to scroll sideways for (or would see cut off): measured in the page, returned as JSON
MEASURE = """(() => {
  const column = document.querySelector("article") || document.body;
  const edge = column.getBoundingClientRect().right + 1;
  const wide = (el) => el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== "visible";
  const overflowing = [];
  for (const el of column.querySelectorAll("table, pre, .doc-signature")) {
    const box = el.getBoundingClientRect();
    let over = box.right > edge || wide(el) || [...el.querySelectorAll("code")].some(wide);
    for (let a = el.parentElement; !over && a && a !== column; a = a.parentElement) over = wide(a);
    if (over) {
      const widest = Math.max(el.scrollWidth, ...[...el.querySelectorAll("code")].map((c) => c.scrollWidth));
      overflowing.push({element: el.tagName.toLowerCase() + (el.className ? "." + el.className.split(" ")[0] : ""),
                        text: el.textContent.trim().replace(/\\s+/g, " ").slice(0, 60),
                        width: Math.round(widest), room: Math.round(edge - box.left)});
    }
  }
  for (const c of column.querySelectorAll("code")) {  // inline code: no line of it past the column's edge
    if (c.closest("pre, table, .doc-signature")) continue;
    const right = Math.max(...[...c.getClientRects()].map((r) => r.right));
    if (right > edge) overflowing.push({element: "code (inline)", text: c.textContent.slice(0, 60),
                                        width: Math.round(right - c.getBoundingClientRect().left),
                                        room: Math.round(edge - c.getBoundingClientRect().left)});
  }
  // a sidebar label cut inside a word: a line ends between two letters of one text (a break at a <wbr> ends a text)
  const range = document.createRange();
  for (const label of document.querySelectorAll(".md-sidebar .md-ellipsis")) {
    if (!label.getClientRects().length) continue;  // in a closed section
    const walker = document.createTreeWalker(label, NodeFilter.SHOW_TEXT);
    let cut = false;  // said once per label
    for (let node = walker.nextNode(); node && !cut; node = walker.nextNode()) {
      let top = null;
      for (let i = 0; i < node.length && !cut; i++) {
        range.setStart(node, i); range.setEnd(node, i + 1);
        const rect = range.getClientRects()[0];
        if (!rect) continue;
        if (top !== null && rect.top > top + 2 && !/[\\s\\-–—]/.test(node.data[i - 1]) && !/\\s/.test(node.data[i]))
          cut = overflowing.push({element: "sidebar label cut in a word", text: label.textContent.trim().slice(0, 60),
                                  width: i, room: 0}) > 0;
        top = rect.top;
      }
    }
  }
  return {height: document.documentElement.scrollHeight, overflowing: overflowing};
})()"""


def find_browser() -> str | None:
    """The first Chromium on the ``PATH``, or ``None``."""
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


class Browser:
    """One headless Chromium, driven over the DevTools protocol on a pipe (messages are JSON ending in a NUL)."""

    #: seconds to wait for any message from the browser before giving up
    timeout = 120.0

    def __init__(self, executable: str, width: int = WIDTH) -> None:
        to_child, self._out = os.pipe()  # we write commands; the browser reads them on its fd 3
        self._in, from_child = os.pipe()  # the browser writes replies and events on its fd 4

        def fds() -> None:  # the pipe's ends onto fds 3 and 4 (through copies: either may be 3 or 4 already)
            read, write = os.dup(to_child), os.dup(from_child)
            os.dup2(read, 3)
            os.dup2(write, 4)

        args = [
            executable,
            "--headless",
            "--remote-debugging-pipe",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--allow-file-access-from-files",
            f"--window-size={width},1000",
            "about:blank",
        ]
        self._proc = subprocess.Popen(args, preexec_fn=fds, pass_fds=(3, 4),  # noqa: PLW1509
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        os.close(to_child)
        os.close(from_child)
        self._buffer, self._next, self._events = b"", 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=1000, deviceScaleFactor=1,
                  mobile=False)  # fmt: skip

    def _messages(self) -> Iterator[dict[str, Any]]:
        while True:
            while b"\0" not in self._buffer:
                if not select.select([self._in], [], [], self.timeout)[0]:  # a hung browser must not hang CI
                    raise TimeoutError(f"Chromium sent nothing for {self.timeout:.0f} s")
                chunk = os.read(self._in, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed its DevTools pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            yield json.loads(raw)

    def call(self, method: str, session: bool = False, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events that arrive meanwhile are kept for :meth:`wait`)."""
        self._next += 1
        message = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = self._session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        for reply in self._messages():
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._events.append(reply)
        raise AssertionError("unreachable")

    def wait(self, event: str) -> None:
        """Wait for ``event`` of the page (one that already arrived counts)."""
        for i, e in enumerate(self._events):
            if e.get("method") == event:
                del self._events[: i + 1]
                return
        self._events.clear()
        for message in self._messages():
            if message.get("method") == event:
                return

    def measure(self, url: str) -> dict[str, Any]:
        """Load ``url`` and return what :data:`MEASURE` finds there."""
        self._events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait("Page.loadEventFired")
        result = self.call("Runtime.evaluate", session=True, expression=MEASURE, returnByValue=True)
        return result["result"]["value"]

    def close(self) -> None:
        self._proc.kill()
        self._proc.wait()
        os.close(self._out)
        os.close(self._in)


def check(
    site: Path, executable: str, max_api_height: int = 20_000, heights: dict[str, int] | None = None
) -> list[str]:
    """The problems of every page of ``site`` (a built site folder), one line each; ``heights``, when given, gets
    each page's height in pixels."""
    problems = []
    browser = Browser(executable)
    try:
        for page in sorted(site.rglob("index.html")):
            rel = page.parent.relative_to(site).as_posix() or "."
            found = browser.measure(page.resolve().as_uri())
            if heights is not None:
                heights[rel] = found["height"]
            for c in found["overflowing"]:
                if c["element"].startswith("sidebar"):
                    problems.append(f"{rel}: {c['element']} (after character {c['width']}): {c['text']!r}")
                else:
                    problems.append(f"{rel}: {c['element']} {c['width']} px wide in {c['room']} px: {c['text']!r}")
            if rel.startswith("api/") and found["height"] > max_api_height:
                problems.append(f"{rel}: {found['height']} px tall (API pages: at most {max_api_height})")
    finally:
        browser.close()
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("site", type=Path, help="the built site folder (mkdocs build --site-dir ...)")
    p.add_argument("--max-api-height", type=int, default=20_000)
    p.add_argument("--require", action="store_true", help="fail when no Chromium is found (default: skip)")
    args = p.parse_args(argv)
    executable = find_browser()
    if executable is None:
        print(f"layout check skipped: no Chromium on the PATH ({', '.join(BROWSERS)})")
        return 1 if args.require else 0
    heights: dict[str, int] = {}
    problems = check(args.site, executable, args.max_api_height, heights)
    api = {rel: h for rel, h in heights.items() if rel.startswith("api/")}
    tallest = max(api, key=api.__getitem__) if api else None
    print(f"layout check: {len(heights)} pages at {WIDTH} px, {len(problems)} problems"
          + (f"; the tallest API page is {tallest} ({api[tallest]} px)" if tallest else ""))  # fmt: skip
    for line in problems:
        print("  " + line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
