"""The temporary names kglightning's writers use, and telling which of them no writer will finish.

Every writer of the cache (and :func:`~kglightning.data.sources.loaders.write_records`) writes a file or folder
under a temporary name beside its target, ``.<name>.kgl-<host>.<pid>.tmp`` (:func:`temporary_name`), and renames it
when whole. A writer killed part-way leaves that name behind. The ``kgl-`` token tells kglightning's temporaries
from a user's ``.backup.2023.tmp`` or ``.notes.1.tmp``; the names of the release before it, ``.<name>.<host>.<pid>.tmp``
without the token, are still recognised when they carry *this* host's name. A temporary is abandoned
(:func:`stale_temporary`) when it is this user's (not a link) and

* its process is gone on this host and nothing was written in it for ten minutes (:data:`QUIET_S`), or
* it carries the token and nothing was written in it for a day (:data:`TMP_AGE_S`), whatever its host: a container
  gets a new host name every run, so another host's temporary is the usual case and can be gigabytes (a record
  store's). Outside the cache this holds for another host's only (this host's are judged by their process), or
* (names of the release before, inside the cache only) it is a folder of another host holding kglightning's marker
  and a day old.

The next writer of the same target removes the abandoned temporaries of that exact target (:func:`writer_temporary`);
``kglightning cache clean`` removes those of the cache's kind folders. Beside a user's own output file (outside the
cache) nothing is removed but temporaries of that exact output name, with the token (or this host's older name).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from kglightning.data.store.cache import default_cache_root
from kglightning.data.store.owned_files import refusal

__all__ = [
    "MARK",
    "TOKEN",
    "Temporary",
    "is_temporary",
    "other_host_temporary",
    "parse_temporary",
    "remove_abandoned",
    "remove_stale_temporaries",
    "stale_temporary",
    "temporary_name",
    "writer_temporary",
]

log = logging.getLogger(__name__)

#: a temporary with the token (any host) untouched this long is taken for abandoned (another host's only, outside
#: the cache)
TMP_AGE_S = 86400.0
#: a temporary of a process gone on this host is abandoned once nothing was written in it for this long (a container
#: that shares the host name sees other pids)
QUIET_S = 600.0
#: the marker of a folder entry (:mod:`~kglightning.data.store.cache_marks`), which a writer's temporary folder holds
MARK = ".kglightning-entry"
#: what sets kglightning's temporary names apart: ``.<name>.kgl-<host>.<pid>.tmp``
TOKEN = "kgl-"
_TOKENED = re.compile(rf"^\.(?P<name>.+?)\.{TOKEN}(?P<host>.+)\.(?P<pid>\d+)\.tmp$")
_ANY_HOST = re.compile(r"^\.(?P<name>.+)\.(?P<host>[^.]+(?:\.[^.]+)*)\.(?P<pid>\d+)\.tmp$")


@dataclass(frozen=True)
class Temporary:
    """What a temporary's name says: the ``target`` it is written for, its ``host`` and ``pid``, and whether it
    carries the token (``tokened``; else a name of the release before, of this host)."""

    target: str
    host: str
    pid: int
    tokened: bool


def temporary_name(name: str, host: str | None = None, pid: int | None = None) -> str:
    """The temporary name of a writer of ``name``: ``.<name>.kgl-<host>.<pid>.tmp`` (this process by default).

    Example:
        >>> temporary_name("index.arrow", "box", 42)
        '.index.arrow.kgl-box.42.tmp'
    """
    return f".{name}.{TOKEN}{host or socket.gethostname()}.{os.getpid() if pid is None else pid}.tmp"


def parse_temporary(name: str, target: str | None = None) -> Temporary | None:
    """What the temporary name ``name`` says (:class:`Temporary`), or ``None`` when it is not one of kglightning's:
    a name with the token (any host), or this host's name of the release before; ``target``, when given, must be
    the name it is written for, exactly.

    Example:
        >>> parse_temporary(".train.jsonl.kgl-a.b.7.tmp")
        Temporary(target='train.jsonl', host='a.b', pid=7, tokened=True)
        >>> parse_temporary(".train.jsonl.backup.2023.tmp") is None  # a user's file (unless this host is "backup")
        True
    """
    if target is not None:
        m = re.match(rf"^\.{re.escape(target)}\.{TOKEN}(.+)\.(\d+)\.tmp$", name)
        if m is not None:
            return Temporary(target, m.group(1), int(m.group(2)), True)
    else:
        m = _TOKENED.match(name)
        if m is not None:
            return Temporary(m["name"], m["host"], int(m["pid"]), True)
    host = socket.gethostname()
    what = re.escape(target) if target is not None else "(.+)"
    m = re.match(rf"^\.{what}\.{re.escape(host)}\.(\d+)\.tmp$", name)
    if m is None:
        return None
    return Temporary(target if target is not None else m.group(1), host, int(m.groups()[-1]), False)


def is_temporary(name: str, target: str | None = None) -> bool:
    """Whether ``name`` is a kglightning writer's temporary name (:func:`parse_temporary`; of ``target`` when
    given)."""
    return parse_temporary(name, target) is not None


def other_host_temporary(name: str) -> bool:
    """Whether ``name`` has the form of another host's temporary of the release before the token
    (``.<name>.<host>.<pid>.tmp``). Such a name may be a user's own file as well (``.backup.2023.tmp``): it is never
    removed unless :func:`stale_temporary` finds it is a marked folder a day old in the cache."""
    return not is_temporary(name) and _ANY_HOST.match(name) is not None


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; a number no pid can be
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


def _last_write(path: Path, st: os.stat_result) -> float:
    """When something was last written in ``path``: its own time, or for a folder the newest of its and its
    children's."""
    if not stat.S_ISDIR(st.st_mode):
        return st.st_mtime
    return max((_mtime(f) for f in path.iterdir()), default=st.st_mtime)


def stale_temporary(path: Path, now: float | None = None, in_cache: bool = True) -> bool:
    """Whether ``path`` (a file or a folder of this user, not a link) is a writer's temporary that no writer will
    finish (see the module docstring): this host's whose process is gone and in which nothing was written for ten
    minutes; one with the token in which nothing was written for a day (any host's in the cache, ``in_cache``;
    another host's elsewhere); or, in the cache only, a folder named as the release before the token named
    temporaries, holding kglightning's marker and unchanged for a day."""
    now = time.time() if now is None else now
    try:
        st = path.lstat()
    except OSError:
        return False
    if stat.S_ISLNK(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
        return False  # a link, or another user's: never taken for this user's writer's
    temp = parse_temporary(path.name)
    if temp is None or not temp.tokened:  # a name of the release before (or of no release)
        legacy = temp is not None or _ANY_HOST.match(path.name) is not None
        if legacy and in_cache and now - st.st_mtime > TMP_AGE_S and _marked_folder(path):
            return True
        if temp is None:
            return False
    try:
        quiet = now - max(st.st_mtime, _last_write(path, st))
    except OSError:  # removed meanwhile (its writer finished, or another clean)
        return False
    here = temp.host == socket.gethostname()
    if here and quiet > QUIET_S and not pid_alive(temp.pid):
        return True
    return temp.tokened and (in_cache or not here) and quiet > TMP_AGE_S


def _in_cache(path: Path) -> bool:
    try:
        return Path(os.path.abspath(path)).is_relative_to(os.path.abspath(default_cache_root()))
    except (OSError, ValueError):
        return False


def remove_stale_temporaries(folder: Path, target: str | None, writer: str) -> int:
    """Remove what killed writers left in ``folder``: its children that are temporaries of ``target`` (any target when
    ``None``) that :func:`stale_temporary` finds no writer will finish (folders, or files). Returns how many were
    removed; ``writer`` names them in the log."""
    removed = 0
    in_cache = _in_cache(folder)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return 0
    for name in names:
        if parse_temporary(name, target) is None:
            legacy = _ANY_HOST.match(name)  # another host's name of the release before: in the cache only
            if not in_cache or legacy is None or (target is not None and not name.startswith(f".{target}.")):
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
    """Remove the temporaries of ``path`` (``.<name>.kgl-<host>.<pid>.tmp``) that no writer will finish
    (:func:`stale_temporary`); ``writer`` names them in the log. Returns how many were removed."""
    path = Path(path)
    return remove_stale_temporaries(path.parent, path.name, writer)


def writer_temporary(path: str | os.PathLike, writer: str) -> Path:
    """The temporary name beside ``path`` that this process writes before renaming it to ``path``
    (:func:`temporary_name`, with the token), after removing the temporaries of ``path`` that killed writers left (``writer`` names
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
