"""Check the built site's search box as a reader uses it: task words find a tutorial, guide or method page first, a
class name its API page or a page that teaches it under its name (issue 59).

    mkdocs build --strict --site-dir site && python tools/check_search.py site

The site is served on 127.0.0.1 (the search runs in a web worker, which a ``file://`` page may not start) and each
query of :data:`QUERIES` is typed into the page's address (``?q=``), as a shared search link does; the first result
must be on a page whose path starts with one of the query's expected prefixes. It drives the same headless Chromium
as ``tools/check_layout.py`` and, like it, says it was skipped (exit 0, or 1 with ``--require``) without one. Exits 1
when a query's first result is elsewhere, naming what came first.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_layout import Browser, find_browser  # noqa: E402

#: query -> the path prefixes (relative to the site; "" is the home page alone) its first result may be on
QUERIES: dict[str, tuple[str, ...]] = {
    "own LLM answers": ("tutorials/own-llm-answers/",),
    # lunr drops "own" (a stop word): "own KG" is a search for "KG", which every kglightning.* title matched before
    # the data guide's search tag; "my own answers" is a search for "answers" alone (checked below: the own-LLM
    # tutorial's tag)
    "own KG": ("guides/data/", "tutorials/own-llm-answers/", "guides/serving/"),
    "fit": ("reference/cli/fit/",),
    "installation": ("",),
    "quickstart": ("",),
    "own data": ("guides/data/",),
    "resume training": ("guides/cli/",),
    "clean the cache": ("guides/cli/", "data/"),
    "at most 10% wrong": ("tutorials/answers-with-a-guarantee/",),
    "AnswerSelector parameters": ("api/conformal/selection/",),
    "AnswerSelector's parameters": ("api/conformal/selection/",),  # typed as the issue wrote it, with "'s"
    "AnswerSelector’s parameters": ("api/conformal/selection/",),  # with the apostrophe phones and Macs type
    "install": ("", "guides/docker/"),
    "train": ("tutorials/", "methods/", "guides/"),
    "train a detector": ("methods/kg-guard/", "tutorials/own-llm-answers/", "guides/cli/"),
    "keep answers with a guarantee": ("tutorials/answers-with-a-guarantee/",),
    "conformal sets": ("tutorials/conformal-sets/",),
    "GCR": ("guides/", "tutorials/", "methods/"),
    "GAT detector": ("methods/kg-guard/", "guides/cli/", "api/nn/gat/"),
    "GAT": ("methods/kg-guard/", "guides/cli/", "api/nn/gat/"),
    "detector_gat": ("methods/kg-guard/", "guides/cli/", "api/nn/gat/"),  # each gives the command
    "train the GAT detector": ("methods/kg-guard/", "guides/cli/", "api/nn/gat/"),
    "HallucinationDetector": ("api/modules/detector/",),
    "AnswerSelector": ("api/conformal/selection/",),
    # a class that a tutorial and a method page teach under a heading of its name: any of the three
    # a config by its file name (a page's word is "configs/detector.yaml"), and other words for the tasks
    "detector.yaml": ("methods/kg-guard/",),
    "detector_gat.yaml": ("methods/kg-guard/",),
    "trust.yaml": ("tutorials/answers-with-a-guarantee/", "methods/trust/"),
    "own LLM": ("tutorials/own-llm-answers/",),
    "my own answers": ("tutorials/own-llm-answers/",),
    "false discovery rate": ("tutorials/answers-with-a-guarantee/", "methods/trust/"),
    "abstain": ("tutorials/answers-with-a-guarantee/", "methods/trust/"),
    "selective answering": ("tutorials/answers-with-a-guarantee/", "methods/trust/"),
    "ConformalCallback": ("api/callbacks/conformal/", "tutorials/conformal-sets/", "methods/conformal/"),
}
#: the first results of the page's search, as (title, path) pairs
RESULTS = """JSON.stringify([...document.querySelectorAll('.md-search-result__item > a')].slice(0, 5).map(
  (a) => [(a.querySelector('h1, h2') || a).textContent.trim(), new URL(a.href).pathname]))"""


def misplaced(query: str, results: list[tuple[str, str]], expected: tuple[str, ...]) -> str | None:
    """Why ``query``'s results fail (no result, or a first one on another page), or ``None`` when they pass.

    Example:
        >>> misplaced("GCR", [("Your own data", "/guides/data/")], ("guides/",)) is None
        True
        >>> misplaced("GCR", [("Papers", "/references/"), ("Your own data", "/guides/data/")], ("guides/",))
        "GCR: first 'Papers' (/references/), not a page under guides/"
        >>> misplaced("install", [("Install", "/")], ("", "guides/docker/")) is None  # "" is the home page alone
        True
        >>> misplaced("install", [("Docker", "/api/x/")], ("",))
        "install: first 'Docker' (/api/x/), not a page under the home page"
    """
    if not results:
        return f"{query}: no result (or none before the search index loaded)"
    title, path = results[0]
    where = path.lstrip("/")
    if any(where == "" if prefix == "" else where.startswith(prefix) for prefix in expected):
        return None
    places = " or ".join("the home page" if prefix == "" else prefix for prefix in expected)
    return f"{query}: first {title!r} ({path}), not a page under {places}"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # no line per request
        pass


def _serve(site: Path) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def search(browser: Browser, base: str, query: str, timeout: float = 20.0) -> list[tuple[str, str]]:
    """The first results that the site at ``base`` shows for ``query`` (waiting for its search index to load)."""
    browser.measure(f"{base}/?q={quote(query)}")
    deadline = time.monotonic() + timeout
    while True:
        found = browser.call("Runtime.evaluate", session=True, expression=RESULTS, returnByValue=True)
        results = [tuple(r) for r in json.loads(found["result"]["value"])]
        if results or time.monotonic() > deadline:
            return results
        time.sleep(0.25)


def check(site: Path, executable: str) -> list[str]:
    """The queries whose first result is not where :data:`QUERIES` expects it, one line each."""
    server = _serve(site)
    browser = Browser(executable)
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        problems = []
        for query, expected in QUERIES.items():
            problem = misplaced(query, search(browser, base, query), expected)
            if problem:
                problems.append(problem)
        return problems
    finally:
        browser.close()
        server.shutdown()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("site", type=Path, help="the built site folder (mkdocs build --site-dir ...)")
    p.add_argument("--require", action="store_true", help="fail when no Chromium is found (default: skip)")
    args = p.parse_args(argv)
    executable = find_browser()
    if executable is None:
        print("search check skipped: no Chromium on the PATH")
        return 1 if args.require else 0
    problems = check(args.site, executable)
    print(f"search check: {len(QUERIES)} queries, {len(problems)} problems")
    for line in problems:
        print("  " + line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
