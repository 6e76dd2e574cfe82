"""What the cache holds, sorted for ``kglightning cache``: entries, writers' temporaries and what killed runs left.

Entries are marked (kglightning's), unmarked, or refused (a marker that is not believed: see
:func:`~kglightning.data.store.cache_marks.why_unmarked`); what killed runs left is found by the exact names
kglightning's writers use, and only a regular file of this user of the size kglightning writes counts; no link is
followed, no folder is walked by recursion, a kind folder that
:func:`~kglightning.data.store.cache.untrusted` refuses is not walked at all (kglightning neither reads nor cleans
it), and a folder that cannot be listed is noted and left out while the rest is walked. :mod:`~kglightning.data.store.cache_admin` states the rules."""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from kglightning.data.store.cache import default_cache_root, untrusted
from kglightning.data.store.cache_marks import EMBEDDED, KINDS, LEGACY_KINDS, MARK, marker_of, why_unmarked
from kglightning.data.store.cache_pins import MARKER_SUFFIX
from kglightning.data.store.owned_files import refusal
from kglightning.data.store.temporaries import is_temporary, other_host_temporary, stale_temporary

__all__ = ["CacheEntry", "Found", "entries", "human", "measure", "other_folders", "scan"]

_LOCK_AGE_S, _MEMO_AGE_S = 86400.0, 30 * 86400.0
_LOCK = re.compile(r"^[0-9a-f]{16}\.lock$")  # records/<key>.lock (record_lock.first_reader)
_MEMO = re.compile(r"^[0-9a-f]{20}$")  # records/stamps/<memo> (cache.content_digest)


@dataclass
class CacheEntry:
    """One thing the cache holds: ``kind`` (its kind folder, or ``embedded``), ``path``, ``bytes`` on disk, ``used``
    (a Unix time: last written or read) and ``state``: ``entry`` (marked: kglightning's), ``unmarked`` (no marker:
    never removed), ``refused`` (a marker that is not believed, ``why``: never removed) or ``temporary`` (a
    writer's, running or killed)."""

    kind: str
    path: Path
    bytes: int
    used: float
    state: str = "entry"
    why: str = ""

    @property
    def marked(self) -> bool:
        return self.state == "entry"


@dataclass
class Found:
    """What :func:`scan` found: the entries (marked, unmarked and refused) and temporaries, the ``leftovers`` that
    ``clean`` removes (path, bytes, why), the ``links`` it skipped, the kind folders it did not walk because they
    are not trusted (``untrusted``: path, why), and the folders it could not list (``unreadable``: path, the
    error), which it left out and went on."""

    entries: list[CacheEntry] = field(default_factory=list)
    leftovers: list[tuple[Path, int, str]] = field(default_factory=list)
    links: list[Path] = field(default_factory=list)
    untrusted: list[tuple[Path, str]] = field(default_factory=list)
    unreadable: list[tuple[Path, str]] = field(default_factory=list)

    def children(self, folder: Path) -> list[Path]:
        """The children of ``folder``, sorted; none when it cannot be listed (noted in :attr:`unreadable`)."""
        try:
            return sorted(folder.iterdir())
        except OSError as err:
            self.unreadable.append((folder, err.strerror or str(err)))
            return []


def measure(path: Path) -> int:
    """The bytes on disk under ``path``: an explicit stack of folders read with ``os.scandir`` (no recursion, so a
    folder nested thousands of levels deep is measured too), links not followed."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total, stack = 0, [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    with contextlib.suppress(OSError):
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        else:
                            total += e.stat(follow_symlinks=False).st_size
        except OSError:  # gone, or not readable: not counted
            continue
    return total


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def _wanted(name: str, kinds: list[str] | None) -> bool:
    return name in kinds if kinds else name in KINDS or name in LEGACY_KINDS or name == "embedded"


def scan(root: Path | None = None, kinds: list[str] | None = None, now: float | None = None) -> Found:
    """Walk the kind folders of ``root`` (default the cache root) named in ``kinds`` (default every kind, and the
    embedded benchmark as ``embedded``), following no link, and sort what they hold (see the module docstring)."""
    root = default_cache_root() if root is None else root
    now = time.time() if now is None else now
    found = Found()
    try:
        if not root.is_dir():
            return found
    except OSError as err:  # a folder above it that cannot be entered
        found.unreadable.append((root, err.strerror or str(err)))
        return found
    if _refused(root, found):
        return found
    for p in found.children(root):
        if EMBEDDED.match(p.name) or _any_temporary(p.name) and p.name.startswith(".embedded-"):
            if _wanted("embedded", kinds):  # the embedded benchmark: entries of the root itself
                _sort_or_note(p, "embedded", found, now)
        elif _wanted(p.name, kinds):
            try:
                walk = not p.is_symlink() and p.is_dir() and not _refused(p, found)
            except OSError as err:
                found.unreadable.append((p, err.strerror or str(err)))
                continue
            if p.is_symlink():
                found.links.append(p)
            for child in found.children(p) if walk else ():
                _sort_or_note(child, p.name, found, now)
    found.entries.sort(key=lambda e: e.used)
    return found


def _sort_or_note(child: Path, kind: str, found: Found, now: float) -> None:
    """:func:`_sort` ``child``; one that cannot be looked at is noted in ``found.unreadable`` and left out."""
    try:
        _sort(child, kind, found, now)
    except OSError as err:
        found.unreadable.append((child, err.strerror or str(err)))


def _refused(folder: Path, found: Found) -> bool:
    """Whether ``folder`` (the root, or a kind folder) is not trusted (another user's, or writable by others: what is
    in it may have been put there by anyone), noted in ``found``."""
    try:
        why = untrusted(folder)
    except OSError as err:
        why = str(err)
    if why is not None:
        found.untrusted.append((folder, why))
    return why is not None


def _any_temporary(name: str) -> bool:
    return is_temporary(name) or other_host_temporary(name)


def _writers(child: Path) -> bool:
    """Whether ``child`` is a writer's temporary: by its name (with the token, any host's; or this host's name of
    the release before), or another host's folder named as the release before named them that holds kglightning's
    marker (any other file of such a name may be a user's: it is listed as unmarked)."""
    return is_temporary(child.name) or other_host_temporary(child.name) and why_unmarked(child) is None


def _sort(child: Path, kind: str, found: Found, now: float) -> None:
    """Put ``child`` of a kind folder (or an ``embedded-*`` folder of the root) where it belongs in ``found``."""
    name = child.name
    if child.is_symlink():
        found.links.append(child)
    elif _writers(child):
        size = measure(child)
        found.entries.append(CacheEntry(kind, child, size, _mtime(child), "temporary"))
        if stale_temporary(child, now):
            found.leftovers.append((child, size, "left by a writer that did not finish"))
    elif _owner(child, kind) is not None:
        owner = child.with_name(_owner(child, kind) or "")
        if now - _mtime(child) > _LOCK_AGE_S and not os.path.lexists(owner):
            found.leftovers.append((child, measure(child), f"a marker or lock of {owner.name}, which is gone"))
    elif kind == "records" and name == "stamps" and child.is_dir():
        for memo in found.children(child):
            if memo.is_symlink():
                found.links.append(memo)
            elif _MEMO.match(memo.name) and _own_file(memo, 32) and now - _mtime(memo) > _MEMO_AGE_S:
                found.leftovers.append((memo, measure(memo), "a digest memo unused for a month"))
            elif is_temporary(memo.name) and stale_temporary(memo, now):
                found.leftovers.append((memo, measure(memo), "left by a writer that did not finish"))
    else:
        why = why_unmarked(child)
        used = _mtime(marker_of(child)) if why is None else _mtime(child)
        state = "entry" if why is None else "unmarked" if why == "" else "refused"
        found.entries.append(CacheEntry(kind, child, measure(child), used, state, why or ""))


def _own_file(path: Path, size: int) -> bool:
    """Whether ``path`` is a regular file of this user (not a link) of ``size`` bytes: what kglightning writes at
    the names of its bookkeeping files (empty markers, in-use files and locks; a memo of 32 hex digits)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return refusal(st) is None and st.st_size == size


def _owner(path: Path, kind: str) -> str | None:
    """The name of the entry whose lock (``records/<key>.lock``), in-use marker (``.<name>.in-use``) or entry marker
    (``.<name>.kglightning-entry``, beside a file entry) ``path`` is, for a plain file of one of those exact names;
    ``None`` for anything else, a file that is not an empty regular file of this user included (it may be a
    user's own file of that name: listed, never removed)."""
    name = path.name
    if not _own_file(path, 0):
        return None
    if kind == "records" and _LOCK.match(name):
        return name[: -len(".lock")]
    for suffix in (MARKER_SUFFIX, MARK):
        if name.startswith(".") and name.endswith(suffix) and len(name) > len(suffix) + 1:
            return name[1 : -len(suffix)]
    return None


def entries(root: Path | None = None, kinds: list[str] | None = None) -> list[CacheEntry]:
    """The cache's entries and writers' temporaries (see :class:`CacheEntry`), oldest use first."""
    return scan(root, kinds).entries


def other_folders(root: Path | None = None) -> list[str]:
    """The folders of the cache root that are not kglightning's kinds (another tool's; never cleaned)."""
    root = default_cache_root() if root is None else root
    try:
        return sorted(p.name for p in root.iterdir() if p.is_dir() and not _wanted(p.name, None)
                      and not EMBEDDED.match(p.name) and not p.name.startswith("."))  # fmt: skip
    except OSError:  # not there, or not readable (scan says so)
        return []


def human(n: float) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 KiB``, ..., ``3.0 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
