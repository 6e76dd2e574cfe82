"""``kglightning cache list|du|clean``: what the cache holds, how much, and removing what kglightning wrote.

The cache (``$KGLIGHTNING_CACHE``, default ``~/.cache/kglightning``) holds one folder per kind of thing built once
(:data:`~kglightning.data.store.cache_marks.KINDS`: ``records``, ``kg``, ``embeddings``, ``proposals-v2``, ...) and
the embedded benchmark's folders (``embedded-v<V>-seed<S>``). Each child of a kind folder is one *entry*; an entry
that kglightning wrote carries its marker (:mod:`~kglightning.data.store.cache_marks`), and its age is the time it
was last written or read. ``list`` and ``du`` also show entries without the marker (*unmarked*: written by a version
of kglightning before markers, or not by kglightning at all), the temporaries of writers (running or killed), and
the folders of other tools in the cache root; they are never removed.

``clean`` (:func:`~kglightning.data.store.cache_clean.clean`) removes, in every kind or in ``--kind``:

* always: what killed runs left, by the exact names kglightning's writers use: temporaries
  (``.<name>.<host>.<pid>.tmp``) whose process is gone on this host and in which nothing was written for ten
  minutes, or that are a day old; lock files (``records/<key>.lock``), in-use markers (``.<name>.in-use``) and
  entry markers (``.<name>.kglightning-entry``) of entries that are gone, a day old and held by no process; and
  digest memos (``records/stamps/<digest>``) a month old;
* ``--older-than DAYS``: marked entries not used for that long;
* ``--max-size GB`` (default ``KGLIGHTNING_CACHE_MAX_GB`` when it is set): the least recently used marked entries,
  until the marked entries of the kinds cleaned hold at most that much.

It removes only marked entries and kglightning's own temporaries and locks, never an entry a running process has
pinned (:mod:`~kglightning.data.store.cache_pins`), never follows a link (a kind folder or an entry that is a link
is skipped, with a message), removes nothing outside the cache root, and prints every path it removed (``--dry-run``:
would remove, and writes nothing). Nothing is removed when an entry is written: the cache grows until ``clean``
runs.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from kglightning.data.store.cache import default_cache_root
from kglightning.data.store.cache_marks import EMBEDDED, KINDS, LEGACY_KINDS, MARK, is_marked, marker_of
from kglightning.data.store.cache_pins import MARKER_SUFFIX
from kglightning.data.store.temporaries import TMP_AGE_S, is_temporary, stale_temporary

__all__ = ["CacheEntry", "Found", "entries", "main", "max_bytes_from_env", "other_folders", "scan"]

_LOCK_AGE_S, _MEMO_AGE_S = 86400.0, 30 * 86400.0
_LOCK = re.compile(r"^[0-9a-f]{16}\.lock$")  # records/<key>.lock (record_store.first_reader)
_MEMO = re.compile(r"^[0-9a-f]{20}$")  # records/stamps/<memo> (cache.content_digest)
_NO_LINKS = "a symbolic link; kglightning follows no link out of its cache"


@dataclass
class CacheEntry:
    """One thing the cache holds: ``kind`` (its kind folder, or ``embedded``), ``path``, ``bytes`` on disk, ``used``
    (a Unix time: last written or read) and ``state``: ``entry`` (marked: kglightning's), ``unmarked`` (no marker:
    never removed) or ``temporary`` (a writer's, running or killed)."""

    kind: str
    path: Path
    bytes: int
    used: float
    state: str = "entry"

    @property
    def marked(self) -> bool:
        return self.state == "entry"


@dataclass
class Found:
    """What :func:`scan` found: the entries (marked and unmarked) and temporaries, the ``leftovers`` that ``clean``
    removes (path, bytes, why), and the ``links`` it skipped."""

    entries: list[CacheEntry] = field(default_factory=list)
    leftovers: list[tuple[Path, int, str]] = field(default_factory=list)
    links: list[Path] = field(default_factory=list)


def measure(path: Path) -> int:
    """The bytes on disk under ``path`` (links not followed)."""
    try:
        st = path.lstat()
    except OSError:
        return 0
    if not stat.S_ISDIR(st.st_mode):
        return st.st_size
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
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
    if not root.is_dir():
        return found
    for p in sorted(root.iterdir()):
        if EMBEDDED.match(p.name) or is_temporary(p.name) and p.name.startswith(".embedded-"):
            if _wanted("embedded", kinds):  # the embedded benchmark: entries of the root itself
                _sort(p, "embedded", found, now)
        elif _wanted(p.name, kinds):
            if p.is_symlink():
                found.links.append(p)
            elif p.is_dir():
                for child in sorted(p.iterdir()):
                    _sort(child, p.name, found, now)
    found.entries.sort(key=lambda e: e.used)
    return found


def _sort(child: Path, kind: str, found: Found, now: float) -> None:
    """Put ``child`` of a kind folder (or an ``embedded-*`` folder of the root) where it belongs in ``found``."""
    name = child.name
    if child.is_symlink():
        found.links.append(child)
    elif is_temporary(name):
        size = measure(child)
        found.entries.append(CacheEntry(kind, child, size, _mtime(child), "temporary"))
        if stale_temporary(child, now):
            found.leftovers.append((child, size, "left by a writer that did not finish"))
    elif _owner(child, kind) is not None:
        owner = child.with_name(_owner(child, kind) or "")
        if now - _mtime(child) > _LOCK_AGE_S and not os.path.lexists(owner):
            found.leftovers.append((child, measure(child), f"a marker or lock of {owner.name}, which is gone"))
    elif kind == "records" and name == "stamps" and child.is_dir():
        for memo in sorted(child.iterdir()):
            if memo.is_symlink():
                found.links.append(memo)
            elif _MEMO.match(memo.name) and memo.is_file() and now - _mtime(memo) > _MEMO_AGE_S:
                found.leftovers.append((memo, measure(memo), "a digest memo unused for a month"))
            elif is_temporary(memo.name) and stale_temporary(memo, now):
                found.leftovers.append((memo, measure(memo), "left by a writer that did not finish"))
    else:
        marked = is_marked(child)
        used = _mtime(marker_of(child)) if marked else _mtime(child)
        found.entries.append(CacheEntry(kind, child, measure(child), used, "entry" if marked else "unmarked"))


def _owner(path: Path, kind: str) -> str | None:
    """The name of the entry whose lock (``records/<key>.lock``), in-use marker (``.<name>.in-use``) or entry marker
    (``.<name>.kglightning-entry``, beside a file entry) ``path`` is, for a plain file of one of those exact names;
    ``None`` for anything else."""
    name = path.name
    if not path.is_file():
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
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not _wanted(p.name, None)
                  and not EMBEDDED.match(p.name) and not p.name.startswith("."))  # fmt: skip


def human(n: float) -> str:
    """``n`` bytes for people: ``512 B``, ``1.5 KiB``, ..., ``3.0 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def max_bytes_from_env() -> int | None:
    """``KGLIGHTNING_CACHE_MAX_GB`` in bytes (the default of ``clean --max-size``), or ``None`` when it is unset,
    empty or infinite.

    Raises:
        ValueError: a value that is not a number of GB >= 0 (``nan``, ``-1``, ``5GB``).
    """
    value = os.environ.get("KGLIGHTNING_CACHE_MAX_GB", "").strip()
    return _gigabytes(value, "KGLIGHTNING_CACHE_MAX_GB") if value else None


def _gigabytes(value: str, what: str) -> int | None:
    try:
        gb = float(value)
    except ValueError:
        gb = math.nan
    if not gb >= 0:
        raise ValueError(f"{what}={value!r}: expected a number of GB >= 0")
    return None if math.isinf(gb) or gb * 2**30 >= 2**62 else int(gb * 2**30)


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        days = math.nan
    if not days >= 0:
        raise ValueError(f"--older-than {value}: expected a number of days >= 0")
    return days


def _show(root: Path, kinds: list[str] | None, du: bool) -> None:
    found, now = scan(root, kinds), time.time()
    if du:
        totals: dict[str, int] = {}
        for e in found.entries:
            key = e.kind if e.marked else f"{e.kind} ({e.state})"
            totals[key] = totals.get(key, 0) + e.bytes
        for kind, n in sorted(totals.items()):
            print(f"{kind:28s} {human(n):>10s}")
        print(f"{'total':28s} {human(sum(totals.values())):>10s}  ({root})")
    else:
        print(f"{root}")
        for e in found.entries:
            note = "" if e.marked else f"  ({e.state}{': never removed by clean' if e.state == 'unmarked' else ''})"
            print(f"{e.kind:18s} {human(e.bytes):>10s} {(now - e.used) / 86400:7.1f} d  {e.path.name}{note}")
    for link in found.links:
        print(f"skipped {link}: {_NO_LINKS}")
    if any(e.state == "unmarked" for e in found.entries):
        print("unmarked: no kglightning marker (written before markers existed, or not by kglightning); "
              "`kglightning cache clean` leaves them: remove them by hand once no run needs them")  # fmt: skip
    others = [] if kinds else other_folders(root)
    if others:
        print(f"not kglightning's, not counted: {', '.join(others)}")


def main(argv: list[str] | None = None, prog: str = "kglightning cache") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("list", "du", "clean"))
    p.add_argument("--kind", nargs="+", default=None, help="only these kinds (records, kg, embeddings, embedded, ...)")
    p.add_argument("--older-than", default=None, metavar="DAYS", help="clean: marked entries unused this long")
    p.add_argument("--max-size", default=None, metavar="GB",
                   help="clean: keep at most this much in marked entries (default: $KGLIGHTNING_CACHE_MAX_GB)")
    p.add_argument("--dry-run", action="store_true", help="clean: say what would go; remove and write nothing")
    args = p.parse_args(argv)
    root = default_cache_root()
    if args.action in ("list", "du"):
        _show(root, args.kind, args.action == "du")
        return 0
    from kglightning.data.store.cache_clean import clean

    try:
        older = None if args.older_than is None else _days(args.older_than) * 86400
        cap = max_bytes_from_env() if args.max_size is None else _gigabytes(args.max_size, "--max-size")
    except ValueError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    done = clean(root, older, cap, args.kind, args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for path, size, why in done.removed:
        print(f"{verb} {path} ({human(size)}; {why})")
    for line in done.skipped:
        print(f"skipped {line}")
    print(f"{verb} {len(done.removed)} paths, {human(sum(size for _, size, _ in done.removed))}")
    if done.unmarked:
        print(f"left {len(done.unmarked)} unmarked entries ({human(sum(e.bytes for e in done.unmarked))}): no "
              "kglightning marker; `kglightning cache list` names them, remove them by hand")  # fmt: skip
    return 0
