"""The temporary names kglightning's writers use, and telling which of them no writer will finish.

Every writer of the cache (and :func:`~kglightning.data.sources.loaders.write_records`) writes a file or folder
under a temporary name beside its target, ``.<name>.<host>.<pid>.tmp``, and renames it when whole. A writer killed
part-way leaves that name behind; :func:`stale_temporary` tells from the name alone whose it was: a temporary of a
process that is gone on this host (and in which nothing was written for ten minutes), or one untouched for a day on
any host, will never be finished. The next writer of the same target removes those
(:func:`writer_temporary`), and ``kglightning cache clean`` removes those of the cache's kind folders.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import shutil
import socket
import stat
import time
from pathlib import Path

__all__ = [
    "is_temporary",
    "remove_abandoned",
    "remove_mkstemp_leftovers",
    "remove_stale_temporaries",
    "stale_temporary",
    "temporary_name",
    "writer_temporary",
]

log = logging.getLogger(__name__)

#: a temporary untouched this long is taken for abandoned wherever its writer ran
TMP_AGE_S = 86400.0
#: a temporary of a process gone on this host is abandoned once nothing was written in it for this long (a container
#: that shares the host name sees other pids)
QUIET_S = 600.0
_NAME = re.compile(r"^\..+\.\d+\.tmp$")  # .<name>.<host>.<pid>.tmp (a host name may hold dots)


def temporary_name(name: str, host: str | None = None, pid: int | None = None) -> str:
    """The temporary name of a writer of ``name``: ``.<name>.<host>.<pid>.tmp`` (this process by default)."""
    return f".{name}.{host or socket.gethostname()}.{os.getpid() if pid is None else pid}.tmp"


def is_temporary(name: str) -> bool:
    """Whether ``name`` has the form of :func:`temporary_name`."""
    return _NAME.match(name) is not None


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


def stale_temporary(path: Path, now: float | None = None, host: str | None = None) -> bool:
    """Whether ``path`` is a writer's temporary (``.<name>.<host>.<pid>.tmp``, a file or a folder, not a link) that
    no writer will finish: its process is gone (on this host) and nothing was written in it for ten minutes, or it
    has not changed for a day (on any host)."""
    if _NAME.match(path.name) is None:
        return False
    now = time.time() if now is None else now
    try:
        st = path.lstat()
    except OSError:
        return False
    if path.is_symlink():
        return False
    owner, _, pid = path.name[: -len(".tmp")].rpartition(".")
    gone = owner.endswith("." + (host or socket.gethostname())) and not _alive(int(pid))
    if gone:
        try:
            newest = max((_mtime(f) for f in path.iterdir()), default=0.0) if path.is_dir() else 0.0
        except OSError:  # removed meanwhile (its writer finished, or another clean)
            return False
        gone = now - max(newest, st.st_mtime) > QUIET_S
    return gone or now - st.st_mtime > TMP_AGE_S


def remove_stale_temporaries(folder: Path, pattern: str, writer: str) -> int:
    """Remove what killed writers left in ``folder``: its children matching ``pattern`` that
    :func:`stale_temporary` finds no writer will finish (folders, or files). Returns how many were removed;
    ``writer`` names them in the log."""
    removed = 0
    for tmp in Path(folder).glob(pattern):
        if not stale_temporary(tmp):
            continue
        try:
            if tmp.is_dir():
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
    return remove_stale_temporaries(path.parent, f".{glob.escape(path.name)}.*.tmp", writer)


def remove_mkstemp_leftovers(path: str | os.PathLike, writer: str) -> int:
    """Remove the temporaries of ``path`` that earlier versions of a writer named with ``tempfile.mkstemp``
    (``.<name>.<8 random characters>.tmp``, no process id to ask) once they are a day old. Returns how many."""
    path = Path(path)
    exact = re.compile(rf"^\.{re.escape(path.name)}\.[a-z0-9_]{{8}}\.tmp$")
    removed = 0
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        try:
            st = tmp.lstat()
            if exact.match(tmp.name) and stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime > TMP_AGE_S:
                tmp.unlink()
                removed += 1
                log.info("removed %s, left by %s that did not finish", tmp, writer)
        except OSError:
            continue
    return removed


def writer_temporary(path: str | os.PathLike, writer: str) -> Path:
    """The temporary name beside ``path`` that this process writes before renaming it to ``path``
    (:func:`temporary_name`), after removing the temporaries of ``path`` that killed writers left (``writer`` names
    them in the log) and this process's own from an earlier try.

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
