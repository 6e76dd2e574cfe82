"""The temporary names kglightning's writers use, and telling which of them no writer will finish.

Every writer of the cache (and :func:`~kglightning.data.sources.loaders.write_records`) writes a file or folder
under a temporary name beside its target, ``.<name>.<host>.<pid>.tmp``, and renames it when whole. A writer killed
part-way leaves that name behind. A name is taken for a temporary only when it has exactly that form with *this*
host's name (:func:`is_temporary`): a user's ``.backup.2023.tmp`` or ``.notes.1.tmp`` is not one. Such a temporary is
abandoned (:func:`stale_temporary`) when its process is gone on this host and nothing was written in it for ten
minutes. A temporary of another host (:func:`other_host_temporary`) cannot be asked about: it is abandoned only when
it is a folder holding kglightning's marker (``.kglightning-entry``, a regular file of this user that no one else
can write) and a day old, and only inside the cache. The next writer of the same target removes the abandoned
temporaries of that exact target (:func:`writer_temporary`); outside the cache (beside a user's output file) only
this host's, of that exact name. ``kglightning cache clean`` removes those of the cache's kind folders.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import stat
import time
from pathlib import Path

from kglightning.data.store.cache import default_cache_root
from kglightning.data.store.owned_files import refusal

__all__ = [
    "MARK",
    "is_temporary",
    "other_host_temporary",
    "remove_abandoned",
    "remove_stale_temporaries",
    "stale_temporary",
    "temporary_name",
    "writer_temporary",
]

log = logging.getLogger(__name__)

#: a marked temporary folder of another host untouched this long is taken for abandoned (inside the cache only)
TMP_AGE_S = 86400.0
#: a temporary of a process gone on this host is abandoned once nothing was written in it for this long (a container
#: that shares the host name sees other pids)
QUIET_S = 600.0
#: the marker of a folder entry (:mod:`~kglightning.data.store.cache_marks`), which a writer's temporary folder holds
MARK = ".kglightning-entry"
_ANY_HOST = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]+(?:\.[^.]+)*)\.(?P<pid>\d+)\.tmp$")


def temporary_name(name: str, host: str | None = None, pid: int | None = None) -> str:
    """The temporary name of a writer of ``name``: ``.<name>.<host>.<pid>.tmp`` (this process by default)."""
    return f".{name}.{host or socket.gethostname()}.{os.getpid() if pid is None else pid}.tmp"


def _parts(name: str, host: str | None = None) -> tuple[str, int] | None:
    """``(target name, pid)`` of a temporary of ``host`` (default this one) named ``name``, or ``None``."""
    host = host or socket.gethostname()
    suffix = re.match(rf"^\.(.+)\.{re.escape(host)}\.(\d+)\.tmp$", name)
    return None if suffix is None else (suffix.group(1), int(suffix.group(2)))


def is_temporary(name: str, target: str | None = None) -> bool:
    """Whether ``name`` is :func:`temporary_name` of a writer on this host (of ``target`` when given)."""
    parts = _parts(name)
    return parts is not None and (target is None or parts[0] == target)


def other_host_temporary(name: str) -> bool:
    """Whether ``name`` has the form of a temporary of another host (``.<name>.<host>.<pid>.tmp``, the host not this
    one). Such a name may be a user's own file as well (``.backup.2023.tmp``): it is never removed unless
    :func:`stale_temporary` finds it is a marked folder a day old."""
    return not is_temporary(name) and _ANY_HOST.match(name) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0


def _marked_folder(path: Path) -> bool:
    """Whether ``path`` is a folder of this user holding kglightning's marker, a regular file of this user that no one
    else can write."""
    try:
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            return False
        return refusal((path / MARK).lstat(), private=True) is None
    except OSError:
        return False


def stale_temporary(path: Path, now: float | None = None, in_cache: bool = True) -> bool:
    """Whether ``path`` (a file or a folder of this user, not a link) is a writer's temporary that no writer will
    finish: one of this host (:func:`is_temporary`) whose process is gone and in which nothing was written for ten
    minutes, or, in the cache only (``in_cache``), a folder of any host holding kglightning's marker that has not
    changed for a day."""
    now = time.time() if now is None else now
    try:
        st = path.lstat()
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        return False  # a link, or another user's: never taken for this user's writer's
    parts = _parts(path.name)
    if parts is not None and not _alive(parts[1]):
        try:
            newest = max((_mtime(f) for f in path.iterdir()), default=0.0) if stat.S_ISDIR(st.st_mode) else 0.0
        except OSError:  # removed meanwhile (its writer finished, or another clean)
            return False
        if now - max(newest, st.st_mtime) > QUIET_S:
            return True
    if not in_cache or (parts is None and _ANY_HOST.match(path.name) is None):
        return False
    return now - st.st_mtime > TMP_AGE_S and _marked_folder(path)


def _in_cache(path: Path) -> bool:
    try:
        return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(default_cache_root()))
    except (OSError, ValueError):
        return False


def remove_stale_temporaries(folder: Path, target: str | None, writer: str) -> int:
    """Remove what killed writers left in ``folder``: its children that are temporaries of ``target`` (any target when
    ``None``; any host's in the cache, this host's elsewhere) that :func:`stale_temporary` finds no writer will
    finish (folders, or files). Returns how many were removed; ``writer`` names them in the log."""
    removed = 0
    in_cache = _in_cache(folder)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return 0
    for name in names:
        if target is not None and not name.startswith(f".{target}."):
            continue
        if not (is_temporary(name, target) or (in_cache and _ANY_HOST.match(name) is not None)):
            continue
        tmp = folder / name
        if not stale_temporary(tmp, in_cache=in_cache):
            continue
        try:
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp)
            else:
                tmp.unlink()
        except OSError:
            continue
        removed += 1
        log.info("removed %s, left by %s that did not finish", tmp, writer)
    return removed


def remove_abandoned(path: str | os.PathLike, writer: str) -> int:
    """Remove the temporaries of ``path`` (``.<name>.<host>.<pid>.tmp``) that no writer will finish
    (:func:`stale_temporary`); ``writer`` names them in the log. Returns how many were removed."""
    path = Path(path)
    return remove_stale_temporaries(path.parent, path.name, writer)


def writer_temporary(path: str | os.PathLike, writer: str) -> Path:
    """The temporary name beside ``path`` that this process writes before renaming it to ``path``
    (:func:`temporary_name`), after removing the temporaries of ``path`` that killed writers left (``writer`` names
    them in the log) and this process's own from an earlier try. The writer creates it with ``O_EXCL`` (a file:
    :func:`~kglightning.data.store.owned_files.create_new`; a folder: ``mkdir``), so that nothing is written through
    a name someone else prepared.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> t = writer_temporary(d / "index.arrow", "a KG index writer")
        >>> t.parent == d, t.name.startswith(".index.arrow."), t.name.endswith(f".{os.getpid()}.tmp")
        (True, True, True)
    """
    path = Path(path)
    remove_abandoned(path, writer)
    tmp = path.with_name(temporary_name(path.name))
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.unlink(missing_ok=True)
    return tmp
