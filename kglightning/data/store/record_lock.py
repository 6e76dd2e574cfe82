"""The record store's lock: when several processes read a new file at once, one parses it.

When several processes read a new file at once (DDP ranks, a job array), :func:`first_reader` lets one parse it and
write the store (:mod:`~kglightning.data.store.record_store`) while the others wait on ``<key>.lock`` and then load
the store: the file is parsed once. A store that exists is loaded without the lock. The wait is bounded
(``KGLIGHTNING_RECORD_STORE_WAIT_S``, default 7200 s, ``0`` for no lock; a WARNING every 10 minutes names the lock
file); past it, or when no lock can be taken (a read-only cache, a file system without locks), or when the process
that held the lock wrote no store (a full disk, a bad record), a process parses the file on its own, as without the
lock. The lock file is used only when it is a regular file of this user (opened first without following a link or
waiting on a FIFO: :func:`~kglightning.data.store.owned_files.open_own`); anything else at its name means no lock. The
lock files stay beside the stores; ``kglightning cache clean`` removes those a day old, with no store beside them,
that no process holds.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock, Timeout

from kglightning.data.store.cache import private_dir, warn_once
from kglightning.data.store.owned_files import open_own

__all__ = ["first_reader"]

log = logging.getLogger(__name__)


def _wait_limit() -> float:
    value = os.environ.get("KGLIGHTNING_RECORD_STORE_WAIT_S", "7200").strip()
    try:
        limit = float(value)
    except ValueError:
        limit = math.nan
    if math.isnan(limit):
        raise ValueError(f"KGLIGHTNING_RECORD_STORE_WAIT_S={value!r}: expected a number of seconds (0: no lock)")
    return limit


@contextlib.contextmanager
def first_reader(folder: Path, source: str | os.PathLike) -> Iterator[str]:
    """Take the lock of ``folder``'s store for a process about to read ``source`` (see the module docstring).

    Yields ``"first"`` when this process holds the lock without having waited (it parses and writes the store, the
    lock held until the block ends), ``"waited"`` when it held it after another process had it (the block looks for
    the store that process wrote; the lock is released before the block runs, so that processes that find none
    parse at the same time, not one after another), or ``"unlocked"`` (no lock: the wait ran out, or none could be
    taken).
    """
    limit = _wait_limit()
    if limit <= 0:  # no lock asked for: every process reads the file itself
        yield "unlocked"
        return
    lock = FileLock(str(folder.with_name(folder.name + ".lock")))
    start, warned = time.monotonic(), 0.0
    state = "first"
    try:
        private_dir(folder.parent)
        os.close(open_own(lock.lock_file, create=True))  # a regular file of this user: no link, no FIFO (raises)
        while True:
            waited = time.monotonic() - start
            try:
                lock.acquire(timeout=0 if state == "first" else min(60.0, max(limit - waited, 0.0)))
                break
            except Timeout:
                if state == "first":
                    log.info("another process is reading %s into the record store %s; waiting for it", source, folder)
                state = "waited"
                if waited >= limit:
                    log.warning("waited %.1f s for the record store lock %s (KGLIGHTNING_RECORD_STORE_WAIT_S); "
                                "reading %s without it", waited, lock.lock_file, source)  # fmt: skip
                    state = "unlocked"
                    break
                if waited - warned >= 600:
                    warned = waited
                    log.warning("still waiting (%.0f s) for the record store lock %s; if no process is reading %s "
                                "(a lock left behind on a network file system), restart with "
                                "KGLIGHTNING_RECORD_STORE_WAIT_S=0", waited, lock.lock_file, source)  # fmt: skip
    except Exception as err:  # a read-only cache, a file system without locks (filelock raises more than OSError)
        warn_once("no lock", folder.parent, "no lock for the record store %s (%s: %s); reading %s without one", folder,
                  type(err).__name__, err, source, logger=log)  # fmt: skip
        state = "unlocked"
    if state == "waited":
        lock.release()
    try:
        yield state
    finally:
        if state == "first":
            lock.release()
