"""Cache entries in use: a process pins what it reads or writes over its life, and removal skips what is pinned.

An entry of the cache (a child of one of its kind folders) may be in use by a running process that is not holding
its files open: an embedding folder a job appends a shard to every few minutes, a cached map whose pieces are
still being written. :func:`pin` marks the entry as in use: a shared ``flock`` on ``.<entry>.in-use`` beside it,
held until :func:`unpin` (as many times as it was pinned) or the process's exit (the kernel releases it then, also
after a kill). :class:`~kglightning.data.embeddings.EmbeddingCache` pins its folder while the object lives, and
:func:`~kglightning.data.store.stage_map.cached_map` its folder while it maps. :func:`removable` takes the same lock
exclusively, without waiting, before an entry is removed, so ``kglightning cache clean`` skips an entry any
process has pinned; a process that pins an entry while it is being removed waits until the removal ends,
then finds it gone and builds it again. The in-use file is opened without following a link or waiting on a FIFO,
and used only when it is a regular file of this user (:func:`~kglightning.data.store.owned_files.open_own`); a pin
is taken only in a kind folder that :func:`~kglightning.data.store.cache.untrusted` passes. Anything else at its
name is refused: a reader goes on without the pin, and ``clean`` leaves the entry, saying why.

Where ``fcntl`` is missing (Windows), nothing is pinned and every entry counts as removable.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows)
    fcntl = None  # type: ignore[assignment]

from kglightning.data.store.cache import default_cache_root, private_dir, untrusted, untrusted_above, warn_once
from kglightning.data.store.owned_files import NotOurs, create_new, open_own

__all__ = ["MARKER_SUFFIX", "entry_of", "marker", "pin", "removable", "unpin"]

log = logging.getLogger(__name__)

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
    return the entry, or ``None`` (outside the cache, no ``fcntl``, a kind folder that is not trusted, something
    other than a regular file of this user at the in-use file's name, or one that cannot be written: a read-only
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
            same = os.fstat(fd).st_ino == os.stat(marker(entry), follow_symlinks=False).st_ino
        except OSError:
            same = False
        if same:
            _pinned[str(entry)] = [fd, 1]
            return entry
        os.close(fd)  # the marker was removed (kglightning cache clean) while this waited: pin the new one
    return None


def _open_marker(entry: Path) -> int | None:
    """A descriptor of ``entry``'s in-use file, created (its folders ``0700``, like the cache's) when missing, only in
    a kind folder that :func:`~kglightning.data.store.cache.untrusted` passes and only when it is a regular file of
    this user (:func:`~kglightning.data.store.owned_files.open_own`: no link followed, no FIFO waited on); ``None``
    when it cannot be (said once), or cannot be written (a read-only cache)."""
    try:
        why = untrusted_above(entry.parent)
        if why is None:
            with contextlib.suppress(OSError):  # a read-only cache: the file may exist all the same
                private_dir(entry.parent)
            why = untrusted(entry.parent)
    except OSError:
        return None
    if why is not None:
        warn_once("unpinned", entry.parent, "cache entries in %s are not pinned: %s", entry.parent, why, logger=log)
        return None
    try:
        return open_own(marker(entry), create=True)
    except NotOurs as err:
        warn_once("unpinned", entry, "cache entry %s is not pinned: %s", entry, err.strerror, logger=log)
        return None
    except OSError:
        with contextlib.suppress(OSError):
            return open_own(marker(entry))  # a read-only cache whose in-use file exists
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
def removable(entry: Path, create: bool = True) -> Iterator[str | None]:
    """Yields ``None`` when ``entry`` may be removed now (no process pins it), else why not: pinned by a running
    process, or something other than a regular file of this user at its in-use file's name (a link, a FIFO: it is
    not opened, and the entry is left). While the block runs, the in-use file is locked exclusively, so no process can
    pin the entry meanwhile (one that tries waits for the block to end). An in-use file that this created, or that
    belongs to an entry gone by the end of the block, is removed at its end (while still locked): a removal leaves
    no file behind. ``create=False`` (a dry run) writes nothing: an entry without an in-use file is one no process
    has pinned."""
    if fcntl is None:
        yield None
        return
    name = marker(entry)
    fd, created, why = _open_for_removal(name, create)
    if fd is None:
        yield why
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            busy = None
        except OSError:  # held shared by a process that pinned it (or the lock cannot be had: not removed either)
            busy = "in use by a running process"
        yield busy
        if busy is None and (created or not os.path.lexists(entry)):
            with contextlib.suppress(OSError):
                if os.stat(name, follow_symlinks=False).st_ino == os.fstat(fd).st_ino:
                    os.unlink(name)
    finally:
        os.close(fd)


def _open_for_removal(name: Path, create: bool) -> tuple[int | None, bool, str | None]:
    """``(descriptor, whether this created the file, why not)`` of the in-use file ``name`` for :func:`removable`:
    no descriptor (and no reason) when there is none and ``create`` is false, or none can be made (a read-only
    cache); no descriptor and the reason when something other than a regular file of this user is at the name."""
    for _ in range(3):
        try:
            try:
                return open_own(name), False, None
            except FileNotFoundError:
                if not create:  # never pinned
                    return None, False, None
                return create_new(name), True, None
        except NotOurs as err:
            return None, False, f"its in-use file {err.strerror}; left alone"
        except FileExistsError:  # a process pinning the entry made it meanwhile: open that one
            continue
        except OSError:  # none can be made here (a read-only cache: nothing is removed anyway)
            return None, False, None
    return None, False, "its in-use file keeps changing; left alone"
