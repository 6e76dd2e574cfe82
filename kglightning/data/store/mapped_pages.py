"""Giving back the pages of read-only memory maps that a long run has finished reading.

A memory-mapped file (the record store's graphs, an embedding shard) costs no memory until it is read; each page
read then stays in the process's resident set (RSS) until the kernel needs the room. A stage that reads every
question's graph once, or looks rows up all over a 2 GB embedding table, so ends with the whole files in its RSS:
they are clean pages the kernel can drop, but a job scheduler or a memory limit counts them. ``madvise(MADV_DONTNEED)``
takes the pages out of the process; they stay in the page cache, and the next read of one maps it again (a minor
fault, no disk read while the cache holds it).

Only maps that cannot hold a write qualify: dropping a written page of a private map would lose the write.
:func:`release_array` acts on ``numpy.memmap`` views opened read-only (``mode="r"``: a shared map without write
permission) and on nothing else; the record store's graphs and the embedding shards are mapped that way.

``madvise`` is advice: where the kernel refuses it (locked pages, ``mlockall``), it is logged once and the run goes
on with the pages resident. Where the system has no ``madvise`` (Windows) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import mmap
import sys
from collections.abc import Iterable

import numpy as np

__all__ = ["release_array", "release_arrays", "trim_heap"]

log = logging.getLogger(__name__)

_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_refused: set[str] = set()  # what madvise was refused for, logged once each


def _refusal(what: str, err: OSError) -> int:
    if what not in _refused:
        _refused.add(what)
        log.warning("the kernel refused to drop the pages of %s (%s); they stay resident", what, err)
    return 0


def _read_only_map(array: np.ndarray) -> mmap.mmap | None:
    """The :class:`mmap.mmap` behind ``array`` when it is a view of a ``numpy.memmap`` opened with ``mode="r"``."""
    read_only, base = False, array
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap) and base.mode == "r":
            read_only = True
        base = base.base
    return base if read_only and isinstance(base, mmap.mmap) else None


def release_array(array: np.ndarray) -> int:
    """Drop from this process the pages of the whole read-only map behind ``array`` (a ``numpy.memmap`` opened with
    ``mode="r"``, or a view of one); return the bytes of the map, or 0 when ``array`` is not such a view (nothing
    done), the system has no ``madvise`` or the kernel refused it."""
    return release_arrays([array])


def release_arrays(arrays: Iterable[np.ndarray]) -> int:
    """:func:`release_array` once for each distinct map behind ``arrays`` (e.g. the graphs of a chunk of records, all
    views of one map); return the bytes of the maps released."""
    maps = {id(mm): mm for mm in map(_read_only_map, arrays) if mm is not None}
    if _MADV_DONTNEED is None:
        return 0
    total = 0
    for mm in maps.values():
        if not mm.closed and len(mm):
            try:
                mm.madvise(_MADV_DONTNEED)
            except OSError as err:
                _refusal("a read-only numpy memory map", err)
            else:
                total += len(mm)
    return total


@functools.cache
def _malloc_trim():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim_heap() -> bool:
    """Give the heap's free memory back to the operating system (glibc's ``malloc_trim(0)``); return whether it was
    done (``False`` where the C library has no such call).

    A loop that allocates and frees large temporaries per question (UAG's path scores: arrays of megabytes, a few
    thousand per question) leaves glibc's heap holding the freed memory: glibc raises its threshold for serving large
    blocks from their own maps as they are freed, so later ones come from the heap, which it rarely shrinks. The
    process's RSS then grows to the largest heap it ever had (about 1.3 GB of free memory after scoring 300
    WebQSP-size questions, against 33 MB of scores). Calling this between chunks of work keeps it near what is live.
    """
    fn = _malloc_trim()
    if fn is None:
        return False
    fn(0)
    return True
