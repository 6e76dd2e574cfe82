"""``kglightning cache list|du|clean``: what the cache holds, how much, and removing what is no longer used.

The cache (``$KGLIGHTNING_CACHE``, default ``~/.cache/kglightning``) holds one folder per kind of thing built once:
``records`` (record stores, :mod:`~kglightning.data.store.record_store`), ``kg`` (KG indexes), ``embeddings``,
``proposals-v2`` and the others that data modules write. Each child of a kind folder is one *entry*; its age is the
time it was last written or, for a record store, last loaded.

``clean`` removes, in every kind or in ``--kind``:

* always: temporary folders that killed writers left (their process gone on this host and nothing written in them
  for ten minutes, or a day old), record stores torn by a killed removal (no ``meta.json``, an hour old), lock files
  with no entry beside them that are a day old and that no process holds, and ``stat`` memos of the record store
  (``records/stamps``) a month old;
* ``--older-than DAYS``: entries not used for that long;
* ``--max-size GB``: the least recently used entries until the kind's total (or the cache's) is under the size.

Removing an entry a running process has open is safe on POSIX systems (the process keeps its open files); the next
run builds the entry again.

``KGLIGHTNING_CACHE_MAX_GB`` applies ``--max-size`` to the whole cache each time an entry is written (a record
store, a KG index, proposals, an embedding shard, a finished map step): :func:`enforce_cap`. It spares the entry
just written and any entry written in the last ten minutes, which a running job may still be writing.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import logging
import math
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kglightning.data.store.cache import default_cache_root

__all__ = [
    "CacheEntry",
    "clean",
    "enforce_cap",
    "entries",
    "main",
    "max_bytes_from_env",
    "remove_abandoned",
    "remove_stale_temporaries",
    "stale_temporary",
    "writer_temporary",
]

log = logging.getLogger(__name__)

_TMP_AGE_S, _QUIET_S, _LOCK_AGE_S, _TORN_AGE_S, _STAMP_AGE_S = 86400.0, 600.0, 86400.0, 3600.0, 30 * 86400.0
_NOT_ENTRIES = {("records", "stamps")}  # bookkeeping of a kind, not an entry


@dataclass
class CacheEntry:
    """One thing the cache holds: ``kind`` (its top folder), ``path``, ``bytes`` on disk, and ``used`` (a Unix time:
    last written or loaded)."""

    kind: str
    path: Path
    bytes: int
    used: float


def _size(path: Path) -> int:
    return _measure(path)[0]


def _measure(path: Path) -> tuple[int, float]:
    """The bytes on disk under ``path``, and the newest modification time of ``path`` or anything in it."""
    try:
        st = path.lstat()
    except OSError:
        return 0, 0.0
    if path.is_symlink() or not path.is_dir():
        return st.st_size, st.st_mtime
    total, newest = 0, st.st_mtime
    for dirpath, dirs, files in os.walk(path):
        for name in (*files, *dirs):
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(dirpath, name))
                newest = max(newest, info.st_mtime)
                if name in files:
                    total += info.st_size
    return total, newest


def _used(path: Path) -> float:
    """The entry's modification time: set when it was written, and when a record store is loaded (access times are
    not used: reading a folder, even to measure it, may move them)."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _is_aux(path: Path) -> bool:
    """A lock file, a writer's temporary folder or a kind's bookkeeping: not an entry of its own."""
    return (
        path.name.endswith(".lock")
        or (path.name.startswith(".") and path.name.endswith(".tmp"))
        or (path.parent.name, path.name) in _NOT_ENTRIES
    )


def entries(root: Path | None = None, kinds: list[str] | None = None) -> list[CacheEntry]:
    """The cache's entries (see the module docstring), oldest use first."""
    root = default_cache_root() if root is None else root
    out: list[CacheEntry] = []
    if not root.is_dir():
        return out
    for kind_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if kinds and kind_dir.name not in kinds:
            continue
        for child in kind_dir.iterdir():
            if not _is_aux(child):
                out.append(CacheEntry(kind_dir.name, child, _size(child), _used(child)))
    return sorted(out, key=lambda e: e.used)


def _remove(path: Path, dry_run: bool) -> None:
    if dry_run:
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _stale_aux(root: Path, kinds: list[str] | None, now: float) -> list[Path]:
    host = socket.gethostname()
    stale = []
    for kind_dir in (p for p in root.iterdir() if p.is_dir()) if root.is_dir() else ():
        if kinds and kind_dir.name not in kinds:
            continue
        for child in kind_dir.iterdir():
            try:
                age = now - child.stat().st_mtime
            except OSError:
                continue
            if child.name.endswith(".lock"):
                if age > _LOCK_AGE_S and not child.with_name(child.name[: -len(".lock")]).exists():
                    stale.append(child)
            elif stale_temporary(child, now, host):
                stale.append(child)
            elif kind_dir.name == "records" and child.name == "stamps" and child.is_dir():
                stale += [m for m in child.iterdir() if _age(m, now) > _STAMP_AGE_S]
            elif kind_dir.name == "records" and child.is_dir() and not child.name.startswith("."):
                if not (child / "meta.json").exists() and age > _TORN_AGE_S:  # a removal killed part-way
                    stale.append(child)
    return stale


def _age(path: Path, now: float) -> float:
    try:
        return now - path.stat().st_mtime
    except OSError:
        return 0.0


def _remove_lock(path: Path, dry_run: bool) -> None:
    """Remove a lock file only while holding it: a process that holds it, or waits on it, keeps it."""
    from filelock import FileLock, Timeout

    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except (Timeout, OSError):
        return
    try:
        if not dry_run:
            with contextlib.suppress(OSError):
                path.unlink()
    finally:
        lock.release()


def stale_temporary(path: Path, now: float | None = None, host: str | None = None) -> bool:
    """Whether ``path`` is a writer's temporary folder (``.<name>.<host>.<pid>.tmp``) that no writer will finish: its
    process is gone (on this host), or it has not changed for a day (on any host)."""
    name = path.name
    if not (name.startswith(".") and name.endswith(".tmp")):
        return False
    now = time.time() if now is None else now
    try:
        written = path.stat().st_mtime
    except OSError:
        return False
    owner, _, pid = name[: -len(".tmp")].rpartition(".")
    gone = owner.endswith("." + (host or socket.gethostname())) and pid.isdigit() and not _alive(int(pid))
    if gone:  # a container sharing the host name sees other pids: also ask that nothing was written lately
        try:
            newest = max((_used(f) for f in path.iterdir()), default=0.0) if path.is_dir() else 0.0
        except OSError:  # removed meanwhile (its writer finished, or another clean)
            return False
        gone = now - max(newest, written) > _QUIET_S
    return gone or now - written > _TMP_AGE_S


def remove_stale_temporaries(folder: Path, pattern: str, writer: str) -> int:
    """Remove what killed writers left in ``folder``: its children matching ``pattern`` that
    :func:`stale_temporary` finds no writer will finish (folders, or files). Returns how many were removed;
    ``writer`` names them in the log."""
    removed = 0
    for tmp in Path(folder).glob(pattern):
        if not stale_temporary(tmp):
            continue
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            try:
                tmp.unlink()
            except OSError:
                continue
        removed += 1
        log.info("removed %s, left by %s that did not finish", tmp, writer)
    return removed


def writer_temporary(path: str | os.PathLike, writer: str) -> Path:
    """The temporary name beside ``path`` that this process writes before renaming it to ``path``
    (``.<name>.<host>.<pid>.tmp``, which :func:`stale_temporary` can tell is abandoned), after removing the
    temporaries of ``path`` that killed writers left (``writer`` names them in the log) and this process's own from
    an earlier try.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> t = writer_temporary(d / "index.arrow", "a KG index writer")
        >>> t.parent == d, t.name.startswith(".index.arrow."), t.name.endswith(f".{os.getpid()}.tmp")
        (True, True, True)
    """
    path = Path(path)
    remove_abandoned(path, writer)
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    _remove(tmp, dry_run=False)
    return tmp


def remove_abandoned(path: str | os.PathLike, writer: str) -> int:
    """Remove the temporaries of ``path`` (``.<name>.<host>.<pid>.tmp``) that no writer will finish
    (:func:`stale_temporary`); ``writer`` names them in the log. Returns how many were removed."""
    path = Path(path)
    return remove_stale_temporaries(path.parent, f".{glob.escape(path.name)}.*.tmp", writer)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def clean(
    root: Path | None = None,
    older_than_s: float | None = None,
    max_bytes: int | None = None,
    kinds: list[str] | None = None,
    dry_run: bool = False,
    keep: Path | None = None,
    leftovers: bool = True,
    spare_busy: bool = False,
) -> list[CacheEntry]:
    """Remove what killed runs left (``leftovers``), then the entries unused for ``older_than_s`` seconds, then the
    least recently used ones until the total is at most ``max_bytes`` (over ``kinds``, default every kind); ``keep``
    is never removed (the entry just written), nor with ``spare_busy`` an entry with anything in it written in the
    last ten minutes (the size cap's rule: a running job may be writing it). Returns the entries removed
    (``dry_run``: that would be)."""
    root = default_cache_root() if root is None else root
    now = time.time()
    for aux in _stale_aux(root, kinds, now) if leftovers else ():
        if aux.name.endswith(".lock"):
            _remove_lock(aux, dry_run)
        else:
            _remove(aux, dry_run)
    current = entries(root, kinds)
    gone: list[CacheEntry] = []
    if older_than_s is not None:
        gone += [e for e in current if now - e.used > older_than_s and e.path != keep]
    if max_bytes is not None:
        left = [e for e in current if e not in gone]
        total = sum(e.bytes for e in left)
        for e in left:  # oldest use first
            if total <= max_bytes:
                break
            if e.path != keep and not (spare_busy and now - _measure(e.path)[1] < _QUIET_S):
                gone.append(e)
                total -= e.bytes
    for e in gone:
        _remove(e.path, dry_run)
    return gone


def _entry_of(path: Path, root: Path) -> Path | None:
    """The entry (a child of a kind folder of ``root``) that ``path`` is or lies in; ``None`` outside the cache."""
    try:
        parts = path.resolve().relative_to(root.resolve()).parts
    except (OSError, ValueError):
        return None
    return root / parts[0] / parts[1] if len(parts) >= 2 else None


def max_bytes_from_env() -> int | None:
    """``KGLIGHTNING_CACHE_MAX_GB`` in bytes, or ``None`` when it is unset or empty.

    Raises:
        ValueError: a value that is not a number of GB >= 0.
    """
    value = os.environ.get("KGLIGHTNING_CACHE_MAX_GB", "").strip()
    if not value:
        return None
    try:
        cap = float(value)
    except ValueError:
        cap = math.nan
    if not cap >= 0:
        raise ValueError(f"KGLIGHTNING_CACHE_MAX_GB={value!r}: expected a number of GB >= 0")
    return int(cap * 2**30)


_over_cap_said: set[str] = set()


def enforce_cap(written: str | os.PathLike) -> list[CacheEntry]:
    """Apply ``KGLIGHTNING_CACHE_MAX_GB`` to the whole cache after ``written`` (a file or folder in it) was written:
    remove the least recently used entries, of every kind, until the cache fits. The entry holding ``written`` is
    kept, and so is every entry with anything written in it in the last ten minutes (another job may be writing
    it); when the cache still does not fit, a WARNING says so once per process. Nothing is done when the variable
    is unset, or for a path outside the cache. Returns the entries removed."""
    cap = max_bytes_from_env()
    root = default_cache_root()
    entry = None if cap is None else _entry_of(Path(written), root)
    if entry is None:
        return []
    gone = clean(root, max_bytes=cap, keep=entry, leftovers=False, spare_busy=True)
    for e in gone:
        log.info("removed %s/%s (%s; KGLIGHTNING_CACHE_MAX_GB)", e.kind, e.path.name, _human(e.bytes))
    total = sum(e.bytes for e in entries(root))
    if total > cap and str(root) not in _over_cap_said:
        _over_cap_said.add(str(root))
        log.warning("the cache %s holds %s, over KGLIGHTNING_CACHE_MAX_GB (%s): what remains was written in the last "
                    "ten minutes or is in use", root, _human(total), _human(cap))  # fmt: skip
    return gone


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def main(argv: list[str] | None = None, prog: str = "kglightning cache") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("action", choices=("list", "du", "clean"))
    p.add_argument("--kind", nargs="+", default=None, help="only these top folders (records, kg, embeddings, ...)")
    p.add_argument("--older-than", type=float, default=None, metavar="DAYS", help="clean: entries unused this long")
    p.add_argument("--max-size", type=float, default=None, metavar="GB", help="clean: keep at most this much")
    p.add_argument("--dry-run", action="store_true", help="clean: say what would go, remove nothing")
    args = p.parse_args(argv)
    root = default_cache_root()
    if args.action == "list":
        now = time.time()
        print(f"{root}")
        for e in entries(root, args.kind):
            days = (now - e.used) / 86400
            print(f"{e.kind:14s} {_human(e.bytes):>10s} {days:7.1f} d  {e.path.name}")
        return 0
    if args.action == "du":
        totals: dict[str, int] = {}
        for e in entries(root, args.kind):
            totals[e.kind] = totals.get(e.kind, 0) + e.bytes
        for kind, n in sorted(totals.items()):
            print(f"{kind:14s} {_human(n):>10s}")
        print(f"{'total':14s} {_human(sum(totals.values())):>10s}  ({root})")
        return 0
    if args.older_than is not None and args.older_than < 0 or args.max_size is not None and args.max_size < 0:
        print(f"{prog}: error: --older-than and --max-size must be >= 0", file=sys.stderr)
        return 2
    gone = clean(
        root,
        None if args.older_than is None else args.older_than * 86400,
        None if args.max_size is None else int(args.max_size * 2**30),
        args.kind,
        args.dry_run,
    )
    verb = "would remove" if args.dry_run else "removed"
    for e in gone:
        print(f"{verb} {e.kind}/{e.path.name} ({_human(e.bytes)})")
    print(f"{verb} {len(gone)} entries, {_human(sum(e.bytes for e in gone))}")
    return 0
