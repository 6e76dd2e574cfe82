"""Giving back the pages of read-only memory maps that a long run has finished reading.

A memory-mapped file (the record store's graphs, a large embedding shard) costs no memory until it is read; each page
read then stays in the process's resident set (RSS) until the kernel needs the room. A stage that reads every
question's graph once, or looks rows up all over a 2 GB embedding table, so ends with the whole files in its RSS:
they are clean pages the kernel can drop, but a job scheduler or a memory limit counts them. ``madvise(MADV_DONTNEED)``
takes the pages out of the process; they stay in the page cache, and the next read of one maps it again (a minor
fault, no disk read while the cache holds it).

Only maps that cannot hold a write qualify: dropping a written page of a private map would lose the write.

* :func:`release_array` acts on ``numpy.memmap`` views opened read-only (``mode="r"``: a shared map without write
  permission) and on nothing else.
* A tensor from ``torch.load(path, mmap=True)`` is a *private, writable* map (torch maps it copy-on-write, and
  byteswaps a shard of the other byte order in place). :func:`seal_file_maps` first checks, from ``/proc/self/smaps``,
  that the tensor's storage lies in a map of ``path`` none of whose pages has been written, then takes the write
  permission off its pages (``mprotect``), so that a later write faults loudly instead of being dropped; only a
  sealed tensor is ever released (:func:`release_tensor`). Where that cannot be checked (not Linux) nothing is sealed
  and nothing released.

``madvise`` is advice: where the kernel refuses it (locked pages, ``mlockall``), it is logged once and the run goes
on with the pages resident. Where the system has no ``madvise`` (Windows) nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import mmap
import os
import sys
from collections.abc import Iterable

import numpy as np
import torch

__all__ = ["release_array", "release_arrays", "release_tensor", "seal_file_maps"]

log = logging.getLogger(__name__)

_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)
_PROT_READ = getattr(mmap, "PROT_READ", 1)
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
                return _refusal("a read-only numpy memory map", err)
            total += len(mm)
    return total


@functools.cache
def _libc():
    if _MADV_DONTNEED is None or not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        madvise, mprotect = libc.madvise, libc.mprotect
    except (OSError, AttributeError):
        return None
    for fn in (madvise, mprotect):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        fn.restype = ctypes.c_int
    return madvise, mprotect


def _inner_pages(tensor: torch.Tensor) -> tuple[int, int]:
    """The page-aligned ``[lo, hi)`` addresses of the pages wholly inside ``tensor``'s storage."""
    storage = tensor.untyped_storage()
    page = mmap.PAGESIZE
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    return -(-start // page) * page, end // page * page


def _file_maps() -> list[tuple[int, int, str, int]]:
    """This process's maps of files: ``(start, end, path, written KiB)`` each, from ``/proc/self/smaps``."""
    maps: list[tuple[int, int, str, int]] = []
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as f:
        current = None
        for line in f:
            head = line.split(maxsplit=5)
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a map's header line
                start, end = (int(x, 16) for x in head[0].split("-"))
                current = (start, end, head[5].strip() if len(head) == 6 else "")
            elif current is not None and head and head[0] == "Anonymous:":
                maps.append((*current, int(head[1])))
                current = None
    return maps


def seal_file_maps(items: Iterable[tuple[torch.Tensor, str | os.PathLike]]) -> list[bool]:
    """For each ``(tensor, path)`` (a tensor from ``torch.load(path, mmap=True)``): check that it maps the file
    ``path`` with none of its pages written, and make its pages read-only, so that :func:`release_tensor` can drop
    them without losing anything (a later write into them faults). Return, per item, whether it is sealed: ``False``
    (nothing changed) for a tensor that is not such a map, a map with written pages (e.g. a shard of the other byte
    order, which torch byteswaps in place), storage smaller than a page, or a system where this cannot be checked
    (not Linux). One read of ``/proc/self/smaps`` for all of them."""
    items = list(items)
    fns = _libc()
    if fns is None or not items:
        return [False] * len(items)
    try:
        maps = _file_maps()
    except (OSError, ValueError):
        return [False] * len(items)
    out = []
    for tensor, path in items:
        lo, hi = _inner_pages(tensor) if tensor.device.type == "cpu" else (0, 0)
        target = os.path.realpath(path)
        ok = hi > lo and any(s <= lo and hi <= e and name == target and written == 0 for s, e, name, written in maps)
        out.append(ok and fns[1](ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _PROT_READ) == 0)
    return out


def release_tensor(tensor: torch.Tensor) -> int:
    """Drop from this process the pages of a tensor that :func:`seal_file_maps` sealed (the caller keeps that promise:
    on any other memory this loses data); the next read maps them again from the file. Return the bytes released (0
    without ``madvise``, or when the kernel refused it)."""
    fns = _libc()
    if fns is None:
        return 0
    lo, hi = _inner_pages(tensor)
    if hi <= lo:
        return 0
    if fns[0](ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) != 0:
        err = ctypes.get_errno()
        return _refusal("a memory-mapped embedding shard", OSError(err, os.strerror(err)))
    return hi - lo
