"""``kglightning cache list|du|clean``: what the cache holds, how much, and removing what is no longer used.

The cache (``$KGLIGHTNING_CACHE``, default ``~/.cache/kglightning``) holds one folder per kind of thing built once:
``records`` (record stores, :mod:`~kglightning.data.store.record_store`), ``kg`` (KG indexes), ``embeddings``,
``proposals-v2``, the embedded benchmark (``embedded-*``) and the others that data modules write
(:data:`CAPPED_KINDS`). Each child of a kind folder is one *entry*; its age is the time it was last written or, for a
record store, last loaded. Other folders in the cache root (another tool's, e.g. a ``HF_HOME`` placed there) are
listed and cleaned only when ``--kind`` names them.

``clean`` removes, in every kind or in ``--kind``:

* always: temporary folders that killed writers left (their process gone on this host and nothing written in them
  for ten minutes, or a day old), record stores torn by a killed removal (no ``meta.json``, an hour old), lock files
  with no entry beside them that are a day old and that no process holds, and ``stat`` memos of the record store
  (``records/stamps``) a month old;
* ``--older-than DAYS``: entries not used for that long;
* ``--max-size GB``: the least recently used entries until the kind's total (or the cache's) is under the size.

Removing an entry a running process has open is safe on POSIX systems (the process keeps its open files); the next
run builds the entry again. An entry a running process has pinned (:mod:`~kglightning.data.store.cache_pins`: an
embedding folder while its cache object lives, a cached map while it maps) is never removed.

``KGLIGHTNING_CACHE_MAX_GB`` applies ``--max-size`` each time an entry is written (a record store, a KG index,
proposals, an embedding shard, a finished map step), at most once a minute per process: :func:`enforce_cap`. It
evicts only what kglightning builds again when it is missing (:data:`CAPPED_KINDS`: not the embedded benchmark, nor
folders of other tools sharing the cache root), and spares pinned entries and any entry written in the last ten
minutes.
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

from kglightning.data.store.cache import default_cache_root, warn_once
from kglightning.data.store.cache_pins import MARKER_SUFFIX, entry_of, removable

__all__ = [
    "CacheEntry",
    "clean",
    "enforce_cap",
    "entries",
    "other_folders",
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
#: the kinds the size cap may evict: what kglightning derives and builds again when it is missing (not the embedded
#: benchmark, which data modules read split by split, nor folders of other tools that share the cache root)
CAPPED_KINDS = ("records", "kg", "embeddings", "proposals-v2", "pcst-cuts", "pcst_subgraphs", "detection_graphs",
                "proxy_sft")  # fmt: skip
#: kinds that earlier versions wrote and nothing reads now: listed, cleaned and evicted like the others
LEGACY_KINDS = ("proposals",)
#: the cap walks the cache at most this often per process (a job writes an embedding shard per question)
CAP_EVERY_S = 60.0


@dataclass
class CacheEntry:
    """One thing the cache holds: ``kind`` (its top folder), ``path``, ``bytes`` on disk, ``used`` (a Unix time:
    last written or loaded) and ``newest`` (the last write of anything in it)."""

    kind: str
    path: Path
    bytes: int
    used: float
    newest: float = 0.0  # the newest modification time of anything in it


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
        for names, counted in ((files, True), (dirs, False)):
            for name in names:
                with contextlib.suppress(OSError):
                    info = os.lstat(os.path.join(dirpath, name))
                    newest = max(newest, info.st_mtime)
                    total += info.st_size if counted else 0
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
        path.name.endswith((".lock", MARKER_SUFFIX))
        or (path.name.startswith(".") and path.name.endswith(".tmp"))
        or (path.parent.name, path.name) in _NOT_ENTRIES
    )


def _kind_dirs(root: Path, kinds: list[str] | None) -> list[Path]:
    """The kind folders of ``root`` named in ``kinds``, or by default those kglightning writes (:data:`CAPPED_KINDS`
    and the embedded benchmark's ``embedded-*``): a folder of another tool that shares the cache root is not
    touched unless named."""
    if not root.is_dir():
        return []
    chosen = (lambda n: n in kinds) if kinds else _ours
    return sorted(p for p in root.iterdir() if p.is_dir() and chosen(p.name))


def _ours(kind: str) -> bool:
    return kind in CAPPED_KINDS or kind in LEGACY_KINDS or kind.startswith("embedded-")


def other_folders(root: Path | None = None) -> list[str]:
    """The folders of the cache root that kglightning did not write (left alone unless ``--kind`` names them)."""
    root = default_cache_root() if root is None else root
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not _ours(p.name)) if root.is_dir() else []


def entries(root: Path | None = None, kinds: list[str] | None = None) -> list[CacheEntry]:
    """The cache's entries (see the module docstring), oldest use first."""
    root = default_cache_root() if root is None else root
    out: list[CacheEntry] = []
    for kind_dir in _kind_dirs(root, kinds):
        for child in kind_dir.iterdir():
            if not _is_aux(child):
                size, newest = _measure(child)
                out.append(CacheEntry(kind_dir.name, child, size, _used(child), newest))
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
    for kind_dir in _kind_dirs(root, kinds):
        for child in kind_dir.iterdir():
            try:
                age = now - child.stat().st_mtime
            except OSError:
                continue
            owner = _lock_owner(child)
            if owner is not None:  # a lock or an in-use marker: stale when old and its entry is gone
                if age > _LOCK_AGE_S and not child.with_name(owner).exists():
                    stale.append(child)
            elif stale_temporary(child, now, host):
                stale.append(child)
            elif kind_dir.name == "records" and child.name == "stamps" and child.is_dir():
                stale += [m for m in child.iterdir() if _age(m, now) > _STAMP_AGE_S]
            elif kind_dir.name == "records" and child.is_dir() and not child.name.startswith("."):
                if not (child / "meta.json").exists() and age > _TORN_AGE_S:  # a removal killed part-way
                    stale.append(child)
    return stale


def _lock_owner(path: Path) -> str | None:
    """The name of the entry whose lock (``<name>.lock``) or in-use marker (``.<name>.in-use``) ``path`` is, or
    ``None`` for anything else."""
    if path.name.endswith(".lock"):
        return path.name[: -len(".lock")]
    if path.name.startswith(".") and path.name.endswith(MARKER_SUFFIX):
        return path.name[1 : -len(MARKER_SUFFIX)]
    return None


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
) -> list[CacheEntry]:
    """Remove what killed runs left (``leftovers``), then the entries unused for ``older_than_s`` seconds, then the
    least recently used ones until the total is at most ``max_bytes`` (over ``kinds``, default every kind); ``keep``
    is never removed (the entry just written), nor an entry a running process has pinned. Returns the entries removed
    (``dry_run``: that would be)."""
    root = default_cache_root() if root is None else root
    now = time.time()
    for aux in _stale_aux(root, kinds, now) if leftovers else ():
        if _lock_owner(aux) is not None:
            _remove_lock(aux, dry_run)
        else:
            _remove(aux, dry_run)
    current = entries(root, kinds)
    gone: list[CacheEntry] = []
    if older_than_s is not None:
        gone += [e for e in current if now - e.used > older_than_s and e.path != keep and _take(e.path, dry_run)]
    if max_bytes is not None:
        gone += _evict([e for e in current if e not in gone], max_bytes, keep, False, dry_run, now)
    return gone


def _evict(current: list[CacheEntry], max_bytes: int, keep: Path | None, spare_busy: bool, dry_run: bool,
           now: float) -> list[CacheEntry]:  # fmt: skip
    """Remove entries of ``current`` (oldest use first) until they hold at most ``max_bytes``, never ``keep`` nor a
    pinned entry, nor with ``spare_busy`` one with anything in it written in the last ten minutes (the size cap's
    rule: another job may be writing it)."""
    gone = []
    total = sum(e.bytes for e in current)
    for e in current:
        if total <= max_bytes:
            break
        if e.path == keep or (spare_busy and now - e.newest < _QUIET_S):
            continue
        if _take(e.path, dry_run):
            gone.append(e)
            total -= e.bytes
    return gone


def _take(entry: Path, dry_run: bool) -> bool:
    """Remove ``entry`` unless a process has pinned it (:mod:`~kglightning.data.store.cache_pins`); return whether it
    was (``dry_run``: would be) removed."""
    with removable(entry) as ok:
        if ok:
            _remove(entry, dry_run)
        return ok


def max_bytes_from_env() -> int | None:
    """``KGLIGHTNING_CACHE_MAX_GB`` in bytes, or ``None`` when it is unset, empty or infinite.

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
    return None if math.isinf(cap) or cap * 2**30 >= 2**62 else int(cap * 2**30)


_last_cap: dict[str, float] = {}


def enforce_cap(written: str | os.PathLike) -> list[CacheEntry]:
    """Apply ``KGLIGHTNING_CACHE_MAX_GB`` after ``written`` (a file or folder in the cache) was written: remove the
    least recently used entries of :data:`CAPPED_KINDS` and :data:`LEGACY_KINDS` until they fit. Spared: the entry
    holding ``written``, every entry a running process has pinned (:func:`~kglightning.data.store.cache_pins.pin`),
    and every entry with anything written in it in the last ten minutes. The cache is walked at most once every
    :data:`CAP_EVERY_S` seconds per process. When it still does not fit, or the variable is not a number, a WARNING
    says so once per process; nothing here raises, so a write that succeeded stays a success. Nothing is done when
    the variable is unset, or for a path outside the cache. Returns the entries removed."""
    entry = entry_of(written)
    try:
        cap = max_bytes_from_env()
    except ValueError as err:
        warn_once("bad cap", default_cache_root(), "%s; no size cap applied", err, logger=log)
        return []
    root = default_cache_root()
    now = time.monotonic()
    if cap is None or entry is None or now - _last_cap.get(str(root), -math.inf) < CAP_EVERY_S:
        return []
    _last_cap[str(root)] = now
    try:
        current = entries(root, [*CAPPED_KINDS, *LEGACY_KINDS])
        gone = _evict(current, cap, entry, True, False, time.time())
        total = sum(e.bytes for e in current) - sum(e.bytes for e in gone)
    except OSError as err:  # the cache changed under the walk, or cannot be read: the write itself succeeded
        warn_once("cap failed", root, "could not apply KGLIGHTNING_CACHE_MAX_GB to %s (%s)", root, err, logger=log)
        return []
    for e in gone:
        log.info("removed %s/%s (%s; KGLIGHTNING_CACHE_MAX_GB)", e.kind, e.path.name, _human(e.bytes))
    if total > cap:
        warn_once("over the cap", root, "the cache %s holds %s, over KGLIGHTNING_CACHE_MAX_GB (%s): what remains is in "
                  "use or was written in the last ten minutes", root, _human(total), _human(cap), logger=log)  # fmt: skip
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
        others = [] if args.kind else other_folders(root)
        if others:
            print(f"not kglightning's, not counted (--kind NAME to include): {', '.join(others)}")
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
