"""Cache entries in use: a process pins what it reads or writes over its life, and removal skips what is pinned.

An entry of the cache (a child of one of its kind folders) may be in use by a running process that is not holding
its files open: an embedding folder a job appends a shard to every few minutes, a cached map whose pieces are
still being written. :func:`pin` marks the entry as in use: a shared ``flock`` on ``.<entry>.in-use`` beside it,
held until :func:`unpin` (as many times as it was pinned) or the process's exit (the kernel releases it then, also
after a kill). :class:`~kglightning.data.embeddings.EmbeddingCache` pins its folder while the object lives, and
:func:`~kglightning.data.store.stage_map.cached_map` its folder while it maps. :func:`removable` takes the same lock
exclusively, without waiting, before an entry is removed, so ``kglightning cache clean`` skips an entry any
process has pinned; a process that pins an entry while it is being removed waits until the removal ends,
then finds it gone and builds it again.

Where ``fcntl`` is missing (Windows), nothing is pinned and every entry counts as removable.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows)
    fcntl = None  # type: ignore[assignment]

from kglightning.data.store.cache import default_cache_root, private_dir

__all__ = ["MARKER_SUFFIX", "entry_of", "marker", "pin", "removable", "unpin"]

MARKER_SUFFIX = ".in-use"
_pinned: dict[str, list[int]] = {}  # entry -> [the descriptor holding its shared lock, how many pins]


def entry_of(path: str | os.PathLike, root: Path | None = None) -> Path | None:
    """The entry (a child of a kind folder of ``root``, default the cache root) that ``path`` is or lies in, or
    ``None`` outside the cache. The path is taken as given, then resolved (a kind folder may be a link)."""
    root = default_cache_root() if root is None else root
    for p, r in ((Path(os.path.abspath(path)), Path(os.path.abspath(root))), (Path(path).resolve(), root.resolve())):
        try:
            parts = p.relative_to(r).parts
        except (OSError, ValueError):
            continue
        return root / parts[0] / parts[1] if len(parts) >= 2 else None
    return None


def marker(entry: Path) -> Path:
    """The file whose lock says that ``entry`` is in use: ``.<name>.in-use`` beside it."""
    return entry.with_name(f".{entry.name}{MARKER_SUFFIX}")


def pin(path: str | os.PathLike) -> Path | None:
    """Mark the cache entry holding ``path`` as in use by this process until :func:`unpin` or the process's exit;
    return the entry, or ``None`` (outside the cache, no ``fcntl``, or a marker that cannot be written: a read-only
    cache). Waits while the entry is being removed. Pins of one entry are counted; one lock holds them all."""
    entry = entry_of(path)
    if entry is None or fcntl is None:
        return None
    if str(entry) in _pinned:
        _pinned[str(entry)][1] += 1
        return entry
    for _ in range(10):
        fd = _open_marker(entry)
        if fd is None:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            same = os.fstat(fd).st_ino == os.stat(marker(entry)).st_ino
        except OSError:
            same = False
        if same:
            _pinned[str(entry)] = [fd, 1]
            return entry
        os.close(fd)  # the marker was removed (kglightning cache clean) while this waited: pin the new one
    return None


def _open_marker(entry: Path) -> int | None:
    """A descriptor of ``entry``'s marker, created (its folders ``0700``, like the cache's) when missing; ``None``
    when it cannot be (a read-only cache)."""
    try:
        private_dir(entry.parent)
        return os.open(marker(entry), os.O_RDONLY | os.O_CREAT, 0o600)
    except OSError:
        with contextlib.suppress(OSError):
            return os.open(marker(entry), os.O_RDONLY)  # a read-only cache whose marker exists
        return None


def unpin(entry: Path | None) -> None:
    """Undo one :func:`pin` of ``entry`` (what it returned; ``None`` is ignored); the last one releases the lock."""
    held = None if entry is None else _pinned.get(str(entry))
    if held is None:
        return
    held[1] -= 1
    if held[1] <= 0:
        del _pinned[str(entry)]
        with contextlib.suppress(OSError):
            os.close(held[0])


@contextlib.contextmanager
def removable(entry: Path, create: bool = True) -> Iterator[bool]:
    """Whether ``entry`` may be removed now: no process pins it. While the block runs, the entry's marker is locked
    exclusively, so no process can pin it meanwhile (one that tries waits for the block to end). ``create=False``
    (a dry run) writes nothing: an entry without a marker is one no process has pinned."""
    if fcntl is None:
        fd = None
    elif create:
        fd = _open_marker(entry)
    else:
        try:
            fd = os.open(marker(entry), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # no marker: never pinned
            fd = None
    if fd is None:  # no locks here, or a cache where no marker can be made (read-only: nothing is removed anyway)
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held shared by a process that pinned it (or the lock cannot be had: not removed either)
            yield False
            return
        yield True
    finally:
        os.close(fd)
