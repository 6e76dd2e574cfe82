"""``kglightning cache clean``: remove the cache entries kglightning wrote and no longer uses, and what killed runs left.

What is removed, and what never is, is the rule of :mod:`~kglightning.data.store.cache_admin`: marked entries only
(:mod:`~kglightning.data.store.cache_marks`), and kglightning's own temporaries and locks by their exact names. The
removal itself follows no link and leaves nothing half-removed under an entry's name: every folder is opened
relative to the cache root's with ``O_NOFOLLOW``, an entry folder is first renamed to a writer's temporary name in
its kind folder (so a removal that is killed part-way leaves a temporary that the next ``clean`` removes, never a
torn entry) and then removed through descriptors, without recursion
(:func:`~kglightning.data.store.owned_files.remove_tree_at`, which follows no link). Each removal is said as it
happens (``say``), so a ``clean`` that is stopped part-way has printed what it removed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover (Windows)
    fcntl = None  # type: ignore[assignment]

from kglightning.data.store.cache import default_cache_root
from kglightning.data.store.cache_marks import MARK, marker_of
from kglightning.data.store.cache_pins import MARKER_SUFFIX, removable
from kglightning.data.store.cache_scan import CacheEntry, human, scan
from kglightning.data.store.owned_files import open_own, refusal, remove_tree_at
from kglightning.data.store.temporaries import temporary_name

__all__ = ["Cleaned", "clean"]

_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


@dataclass
class Cleaned:
    """What :func:`clean` did: ``removed`` (path, bytes, why; a dry run: would remove), ``skipped`` (lines saying
    what was left alone and why: links, folders not trusted, markers not believed, entries that could not be
    removed) and the ``unmarked`` entries it left. ``say``, when given, is called with a line for each removal and
    each skip as it happens."""

    removed: list[tuple[Path, int, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    unmarked: list[CacheEntry] = field(default_factory=list)
    say: Callable[[str], None] | None = None
    verb: str = "removed"

    def remove(self, path: Path, size: int, why: str) -> None:
        self.removed.append((path, size, why))
        if self.say is not None:
            self.say(f"{self.verb} {path} ({human(size)}; {why})")

    def skip(self, line: str) -> None:
        self.skipped.append(line)
        if self.say is not None:
            self.say(f"skipped {line}")


class _Folders:
    """Descriptors of the cache root and of folders under it, each opened relative to its parent without following
    a link: a folder replaced by a link after the scan is not entered."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._fds: dict[Path, int | None] = {}

    def fd(self, folder: Path) -> int | None:
        if folder not in self._fds:
            if folder == self.root:
                fd = _open(os.open, str(folder), os.O_RDONLY | os.O_DIRECTORY)
            else:
                parent = self.fd(folder.parent) if folder.parent != folder else None
                fd = None if parent is None else _open(os.open, folder.name, _NOFOLLOW_DIR, dir_fd=parent)
            self._fds[folder] = fd
        return self._fds[folder]

    def close(self) -> None:
        for fd in self._fds.values():
            if fd is not None:
                os.close(fd)


def _open(opener, *args, **kwargs) -> int | None:
    try:
        return opener(*args, **kwargs)
    except OSError:
        return None


def clean(
    root: Path | None = None,
    older_than_s: float | None = None,
    max_bytes: int | None = None,
    kinds: list[str] | None = None,
    dry_run: bool = False,
    leftovers: bool = True,
    say: Callable[[str], None] | None = None,
) -> Cleaned:
    """Remove what killed runs left (``leftovers``), then the marked entries unused for ``older_than_s`` seconds,
    then the least recently used marked entries until those left hold at most ``max_bytes`` (over ``kinds``,
    default every kind). An entry a running process has pinned is never removed. ``dry_run`` removes and writes
    nothing, and says what would go; ``say`` gets a line for each removal and skip as it happens."""
    root = default_cache_root() if root is None else root
    now = time.time()
    found = scan(root, kinds, now)
    done = Cleaned(say=say, verb="would remove" if dry_run else "removed")
    for p in found.links:
        done.skip(f"{p}: a symbolic link; kglightning follows no link out of its cache")
    for p, why in found.untrusted:
        done.skip(f"{p}: {why}; kglightning neither reads nor cleans a folder others could have written")
    for p, why in found.unreadable:
        done.skip(f"{p}: cannot be read ({why})")
    for e in found.entries:
        if e.state == "refused":
            done.skip(f"{e.path}: {e.why}; never removed")
    done.unmarked = [e for e in found.entries if e.state == "unmarked"]
    folders = _Folders(root)
    try:
        for path, size, why in found.leftovers if leftovers else ():
            if _remove_leftover(folders, path, dry_run):
                done.remove(path, size, why)
        marked = [e for e in found.entries if e.marked]
        gone: set[Path] = set()
        if older_than_s is not None:
            for e in marked:
                if now - e.used > older_than_s and _take(folders, e, dry_run, done):
                    gone.add(e.path)
                    done.remove(e.path, e.bytes, f"unused for {(now - e.used) / 86400:.1f} days")
        if max_bytes is not None:
            rest = [e for e in marked if e.path not in gone]
            total = sum(e.bytes for e in rest)
            for e in rest:  # least recently used first
                if total <= max_bytes:
                    break
                if _take(folders, e, dry_run, done):
                    total -= e.bytes
                    done.remove(e.path, e.bytes, f"least recently used, over --max-size {human(max_bytes)}")
    finally:
        folders.close()
    return done


def _take(folders: _Folders, e: CacheEntry, dry_run: bool, done: Cleaned) -> bool:
    """Remove the marked entry ``e`` unless a process has pinned it; return whether it was (would be) removed."""
    with removable(e.path, create=not dry_run) as busy:
        if busy is not None:
            done.skip(f"{e.path}: {busy}")
            return False
        fd = folders.fd(e.path.parent)
        why = "not there" if fd is None else _not_marked(fd, e.path.name)
        if why is not None:
            done.skip(f"{e.path}: changed since it was listed ({why}); left alone")
            return False
        if dry_run:
            return True
        if not _remove_entry(fd, e.path.name):
            done.skip(f"{e.path}: could not be removed")
            return False
        return True


def _not_marked(fd: int, name: str) -> str | None:
    """Why ``name`` in the folder ``fd`` is not (any more) a marked entry (as
    :func:`~kglightning.data.store.cache_marks.why_unmarked` tells, looked at through descriptors only), or ``None``."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return "gone"
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"belongs to another user (uid {st.st_uid})"
    if stat.S_ISDIR(st.st_mode):
        entry = _open(os.open, name, _NOFOLLOW_DIR, dir_fd=fd)
        if entry is None:
            return "cannot be opened"
        try:
            return _marker_refusal(MARK, entry)
        finally:
            os.close(entry)
    if stat.S_ISREG(st.st_mode):
        return _marker_refusal(marker_of(Path(name), folder=False).name, fd)
    return "not a file or a folder"


def _marker_refusal(marker: str, fd: int) -> str | None:
    try:
        why = refusal(os.stat(marker, dir_fd=fd, follow_symlinks=False), private=True)
    except OSError:
        return "no marker"
    return None if why is None else f"its marker {why}"


def _remove_entry(fd: int, name: str) -> bool:
    """Remove the entry ``name`` of the folder ``fd``: a folder is renamed to a temporary name first, then removed
    (a removal killed part-way leaves a temporary, never a torn entry); a file, then its marker beside it."""
    try:
        if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
            aside = temporary_name(name)
            with contextlib.suppress(FileNotFoundError):
                remove_tree_at(fd, aside)
            os.rename(name, aside, src_dir_fd=fd, dst_dir_fd=fd)
            remove_tree_at(fd, aside)
        else:
            os.unlink(name, dir_fd=fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(marker_of(Path(name), folder=False).name, dir_fd=fd)
    except OSError:
        return False
    return True


def _remove_leftover(folders: _Folders, path: Path, dry_run: bool) -> bool:
    """Remove what a killed run left at ``path`` (a temporary file or folder, a lock, a marker, a memo), never a link
    nor another user's; a lock or an in-use marker only while no process holds it. Returns whether it was (would
    be) removed."""
    fd = folders.fd(path.parent)
    if fd is None:
        return False
    try:
        st = os.stat(path.name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        return False
    if path.name.endswith((".lock", MARKER_SUFFIX)):
        return _remove_free_lock(fd, path.name, dry_run)
    if dry_run:
        return True
    try:
        if stat.S_ISDIR(st.st_mode):
            remove_tree_at(fd, path.name)
        else:
            os.unlink(path.name, dir_fd=fd)
    except OSError:
        return False
    return True


def _remove_free_lock(fd: int, name: str, dry_run: bool) -> bool:
    """Remove the lock file ``name`` of the folder ``fd`` while holding it (a process that holds it, or waits on it,
    keeps it); only a regular file of this user is opened (no link followed, no FIFO waited on). ``dry_run`` only
    asks whether it is free, writing nothing."""
    try:
        lock = open_own(name, dir_fd=fd)
    except OSError:
        return False
    try:
        if fcntl is not None:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False
        if not dry_run:
            os.unlink(name, dir_fd=fd)
        return True
    except OSError:
        return False
    finally:
        os.close(lock)
