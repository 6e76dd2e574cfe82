"""Which entries of the cache kglightning wrote: each carries a marker, and only a marked entry is ever removed.

The cache root holds one folder per *kind* (:data:`KINDS`: ``records``, ``kg``, ``embeddings``, ...), and each child
of a kind folder is one *entry* (a record store ``records/<key>/``, a KG index ``kg/index-<key>.arrow``, an encoder's
embedding folder ``embeddings/<encoder>/``, ...); the embedded benchmark's folders (``embedded-v<V>-seed<S>``) are
entries of the root itself. An entry kglightning writes carries a marker:

* a folder entry holds the file ``.kglightning-entry``, written into its temporary folder before the rename that
  puts it in place (:func:`mark_folder`), or, for a folder written piece by piece over many runs (an encoder's
  embedding shards, a cached map's pieces, a dataset's proposals), into the folder when kglightning creates it
  (:func:`entry_folder`);
* a file entry has the file ``.<name>.kglightning-entry`` beside it, written before the file is renamed into place
  (:func:`mark_file`).

An entry counts as marked only when it is this user's (not a link) and its marker is a regular file of this user
that no one else can write (:func:`why_unmarked`): a marker another user put into a folder they can write is not
believed. ``kglightning cache clean`` removes marked entries only (and the temporaries and locks that kglightning's
writers leave, by their exact names); a folder or file without a marker (another tool's, a user's, or an entry
written before markers existed) is listed as unmarked and never removed, and one whose marker is not believed is
skipped with the reason. An entry written before markers existed gets its marker the next time a run reads it and
finds it whole and trusted (:func:`adopt`). The marker's modification time is the entry's last
use: set when it is written, and moved forward when the entry is read (:func:`touch`, at most once an hour), so that
``clean --older-than`` removes what no run has read for that long.

A reader that finds an entry damaged moves it out of the way (:func:`set_aside`) and builds it again; an error of
the system while it reads (no memory, no file handles, an I/O error) says nothing about the entry, which is kept,
and the error raised as it is (:func:`damage` and :func:`system_error` tell them apart).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import stat
import time
from pathlib import Path

from kglightning.data.store.cache import KINDS, private_dir, untrusted
from kglightning.data.store.owned_files import open_own, refusal
from kglightning.data.store.temporaries import MARK, writer_temporary

__all__ = [
    "KINDS",
    "LEGACY_KINDS",
    "MARK",
    "adopt",
    "damage",
    "entry_folder",
    "entry_holding",
    "is_marked",
    "mark_file",
    "mark_folder",
    "marker_of",
    "set_aside",
    "system_error",
    "touch",
    "why_unmarked",
]

log = logging.getLogger(__name__)

#: kinds that earlier versions wrote and nothing reads now: their entries carry no marker, and are listed only
LEGACY_KINDS = ("proposals",)
#: the embedded benchmark's folders, entries of the cache root itself (and those set aside: damaged, or older
#: builds without a marker that could not be trusted)
EMBEDDED = re.compile(r"^embedded-v\d+-seed\d+(\.(unreadable|unmarked)-\d+)?$")
#: a read moves an entry's last use forward at most this often
TOUCH_EVERY_S = 3600.0
_touched: dict[str, float] = {}  # entry -> when this process last recorded its use (time.monotonic)


def marker_of(entry: str | os.PathLike, folder: bool | None = None) -> Path:
    """The marker of ``entry``: ``entry/.kglightning-entry`` for a folder, ``.<name>.kglightning-entry`` beside a
    file (``folder`` says which; by default what ``entry`` is now)."""
    p = Path(entry)
    if folder is None:
        folder = p.is_dir() and not p.is_symlink()
    return p / MARK if folder else p.with_name(f".{p.name}{MARK}")


def why_unmarked(entry: str | os.PathLike) -> str | None:
    """``None`` when ``entry`` carries kglightning's marker and may be taken for kglightning's; ``""`` when it has no
    marker (an unmarked entry); otherwise why its marker is not believed: the entry is a link or another user's, or
    its marker is not a regular file of this user that no one else can write (another user may have put it there)."""
    p = Path(entry)
    try:
        st = p.lstat()
    except OSError:
        return ""
    if stat.S_ISLNK(st.st_mode):
        return ""
    mark = marker_of(p, stat.S_ISDIR(st.st_mode))
    try:
        mst = mark.lstat()
    except OSError:
        return ""
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid}); its marker is not believed"
    why = refusal(mst, private=True)
    return None if why is None else f"its marker {mark.name} {why}; not believed"


def is_marked(entry: str | os.PathLike) -> bool:
    """Whether ``entry`` (this user's, not a link) carries kglightning's marker, a regular file of this user that no
    one else can write (:func:`why_unmarked`)."""
    return why_unmarked(entry) is None


def _write_marker(marker: Path) -> None:
    """Create the marker (``0600``), or open the one there: never through a link, never a FIFO or another user's file
    (:func:`~kglightning.data.store.owned_files.open_own` raises)."""
    fd = open_own(marker, os.O_WRONLY, create=True)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def mark_folder(folder: str | os.PathLike) -> None:
    """Put the marker in ``folder`` (an entry's temporary folder before its rename, or an entry folder kglightning
    created), unless it is there."""
    _write_marker(Path(folder) / MARK)


def mark_file(path: str | os.PathLike) -> None:
    """Put the marker beside the file entry ``path`` (before the file is renamed into place; its folder is made
    ``0700`` when missing)."""
    private_dir(Path(path).parent)
    _write_marker(marker_of(path, folder=False))


def adopt(entry: str | os.PathLike) -> bool:
    """Mark ``entry``, which its reader has just found whole and trusted (owner and permissions, and a full
    validation), as kglightning's when it carries no marker: an entry written before markers existed is read on
    every run, and would otherwise never be one that ``kglightning cache clean`` may remove. Its marker is written
    now, with an INFO. An entry that is marked, whose marker is not believed, that is a link, another user's, or
    not trusted (:func:`~kglightning.data.store.cache.untrusted`) is left as it is, as is one in a read-only cache.
    Returns whether it was marked now."""
    p = Path(entry)
    if why_unmarked(p) != "":  # marked already, or a marker that is not believed (left as it is)
        return False
    try:
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()) or untrusted(p):
            return False
        _write_marker(marker_of(p, folder=stat.S_ISDIR(st.st_mode)))
    except OSError:
        return False
    log.info("cache entry %s had no kglightning marker (written before markers existed); marked now, so that "
             "`kglightning cache clean` may remove it", p)  # fmt: skip
    return True


def entry_folder(folder: str | os.PathLike) -> Path:
    """Make sure the entry folder ``folder`` exists and carries its marker, and return it: a missing one is built
    as a temporary folder holding the marker and renamed into place (``0700``, its missing parents too), so that it
    never exists unmarked; an existing one (a real folder) gets the marker when it lacks it (kglightning writes into
    it from now on: an entry of an earlier version that is written again), unless it is not trusted
    (:func:`~kglightning.data.store.cache.untrusted`: another user's, or writable by others): such a folder is left
    as it is, and the caller, which checks it before use, writes nothing there."""
    folder = Path(folder)
    if folder.is_dir() and not folder.is_symlink():
        if why_unmarked(folder) is not None and untrusted(folder) is None:
            with contextlib.suppress(OSError):  # a marker that is not a file of ours is left (and not believed)
                mark_folder(folder)
        return folder
    private_dir(folder.parent)
    tmp = writer_temporary(folder, "a cache writer")
    tmp.mkdir(mode=0o700)
    try:
        mark_folder(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process made it meanwhile
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def entry_holding(path: str | os.PathLike) -> Path | None:
    """The entry that ``path`` is or lies in: the child, on the way to ``path``, of its nearest folder named as a
    kind (:data:`KINDS`); ``None`` when no folder on the way is (a path outside any cache layout).

    Example:
        >>> entry_holding("/c/proposals-v2/0a1b/proposer-9f/train.jsonl").as_posix()
        '/c/proposals-v2/0a1b'
        >>> entry_holding("/home/me/notes/run.jsonl") is None
        True
    """
    p = Path(os.path.abspath(path))
    for child in (p, *p.parents):
        if child.parent.name in KINDS and child.parent != child:
            return child
    return None


def touch(entry: str | os.PathLike | None) -> None:
    """Record a use of ``entry``: move its marker's modification time to now, when this process has not done so in
    the last hour and the marker is older than that (a few ``stat`` calls an hour; a read-only cache, or an unmarked
    entry, is left as it is)."""
    if entry is None:
        return
    key, now = str(entry), time.monotonic()
    if now - _touched.get(key, -TOUCH_EVERY_S) < TOUCH_EVERY_S:
        return
    _touched[key] = now
    if not is_marked(entry):
        return
    marker = marker_of(entry)
    with contextlib.suppress(OSError):
        if time.time() - marker.lstat().st_mtime >= TOUCH_EVERY_S:
            os.utime(marker, follow_symlinks=False)


def set_aside(entry: str | os.PathLike, why: str) -> Path | None:
    """Move a damaged or untrusted ``entry`` out of its reader's way, to ``<name>.unreadable-<time>`` beside it (its
    marker with it, so that ``kglightning cache clean`` removes it in time like any entry), with a WARNING that
    says ``why`` and where it went. Returns the new path, or ``None`` when it could not be moved."""
    p = Path(entry)
    aside = p.with_name(f"{p.name}.unreadable-{time.time_ns()}")
    sidecar = marker_of(p)
    file_entry = sidecar.parent == p.parent
    try:
        p.rename(aside)
    except OSError as err:
        log.warning("cache entry %s %s, and cannot be moved aside (%s); it is not read", p, why, err)
        return None
    if file_entry and sidecar.is_file():
        with contextlib.suppress(OSError):
            sidecar.rename(marker_of(aside, folder=False))
    log.warning("cache entry %s %s; moved to %s and built again", p, why, aside.name)
    return aside


def system_error(err: BaseException) -> bool:
    """Whether ``err``, raised while a cache entry was read, is the system's (memory, file handles, an I/O error, a
    full disk: an ``OSError`` with an ``errno``; the entry is kept and read again later) rather than the entry's
    damage (set aside and written again): pyarrow tells a stream cut short as an ``OSError`` without ``errno``, and a
    file missing from an entry (a torn record store) is damage too."""
    if isinstance(err, MemoryError):
        return True
    return isinstance(err, OSError) and err.errno is not None and not isinstance(err, FileNotFoundError)


def damage(err: BaseException) -> bool:
    """Whether ``err``, raised by a reader that does nothing but read a cache entry, is the entry's damage (it is set
    aside and built again) rather than the system's (:func:`system_error`: raised as it is, nothing set aside):
    every other ``Exception``, as the record store has always told them apart. That is a ``ValueError`` (pyarrow's
    ``ArrowInvalid``, a ``JSONDecodeError``, a ``UnicodeDecodeError``, a
    :class:`~kglightning.data.records.RecordError`), an ``OSError`` without an ``errno`` (a stream cut short) or a
    missing file, another error of pyarrow's, and the ``TypeError`` or ``KeyError`` of a parser that meets
    well-formed JSON of the wrong shape (``datasets`` reading a piece's schema metadata).

    Example:
        >>> damage(UnicodeDecodeError("utf-8", b"\\xff", 0, 1, "invalid start byte")), damage(TypeError("int"))
        (True, True)
        >>> damage(OSError(24, "Too many open files")), damage(MemoryError()), damage(KeyboardInterrupt())
        (False, False, False)
    """
    return isinstance(err, Exception) and not system_error(err)
