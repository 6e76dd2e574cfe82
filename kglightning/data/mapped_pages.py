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
  that the tensor's storage lies in maps of a file none of whose pages has been written (resident or swapped out),
  then takes the write permission off its pages (``mprotect``), so that a later write faults loudly instead of being
  dropped; :func:`release_tensor` releases only a tensor object it sealed. Where that cannot be checked (not Linux)
  nothing is sealed and nothing released. Sealing splits the map in up to three (the partial pages at the storage's
  ends stay writable and are never released), a cost only a process with tens of thousands of mapped shards would
  notice (``vm.max_map_count``).

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
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is only handled here, never needed: reading records must not import it
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
                _refusal("a read-only numpy memory map", err)
            else:
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


def _parse_smaps(lines: Iterable[bytes]) -> list[tuple[int, int, bool, int]]:
    """Maps from the lines of an ``smaps`` file: ``(start, end, backed by a file, KiB of written pages)`` each.
    Written pages are a private map's copies, resident (``Anonymous``) or swapped out (``Swap``)."""
    maps: list[tuple[int, int, bool, int]] = []
    current: list | None = None
    for line in lines:
        head = line.split(maxsplit=5)
        if len(head) >= 5 and b"-" in head[0] and b":" in head[3] and not head[0].endswith(b":"):  # a map's header
            if current is not None:
                maps.append(tuple(current))  # type: ignore[arg-type]
            start, end = (int(x, 16) for x in head[0].split(b"-"))
            current = [start, end, int(head[4]) != 0, 0]  # inode 0: anonymous memory, not a file
        elif current is not None and head and head[0] in (b"Anonymous:", b"Swap:"):
            current[3] += int(head[1])
    if current is not None:
        maps.append(tuple(current))  # type: ignore[arg-type]
    return maps


def _maps() -> list[tuple[int, int, bool, int]]:
    with open("/proc/self/smaps", "rb") as f:
        return _parse_smaps(f)


def _clean_file_range(maps: list[tuple[int, int, bool, int]], lo: int, hi: int) -> bool:
    """Whether ``[lo, hi)`` is wholly covered by maps of files (one or several adjacent ones) without written pages."""
    at = lo
    for start, end, file_backed, written in sorted(m for m in maps if m[0] < hi and m[1] > lo):
        if start > at or not file_backed or written:
            return False
        at = end
    return at >= hi


_sealed: dict[int, tuple[weakref.ref, int, int]] = {}  # id(tensor) -> (the tensor, its sealed pages [lo, hi))


def _forget(key: int) -> None:
    _sealed.pop(key, None)


def seal_file_maps(tensors: Iterable[torch.Tensor]) -> list[bool]:
    """For each tensor (from ``torch.load(path, mmap=True)``): check that its storage's pages lie in maps of a file
    with none of their pages written, and make them read-only, so that :func:`release_tensor` can drop them without
    losing anything (a later write into them faults). Return, per tensor, whether it is sealed: ``False`` (nothing
    changed) for memory that is not a file map, a map with written pages (e.g. a shard of the other byte order, which
    torch byteswaps in place), storage smaller than a page, or a system where this cannot be checked (not Linux).
    One read of ``/proc/self/smaps`` for all of them."""
    tensors = list(tensors)
    fns = _libc()
    if fns is None or not tensors:
        return [False] * len(tensors)
    try:
        maps = _maps()
    except (OSError, ValueError):
        return [False] * len(tensors)
    out = []
    for tensor in tensors:
        lo, hi = _inner_pages(tensor) if tensor.device.type == "cpu" else (0, 0)
        ok = hi > lo and _clean_file_range(maps, lo, hi)
        ok = ok and fns[1](ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _PROT_READ) == 0
        if ok:
            key = id(tensor)
            _sealed[key] = (weakref.ref(tensor, lambda _, key=key: _forget(key)), lo, hi)
        out.append(ok)
    return out


def release_tensor(tensor: torch.Tensor) -> int:
    """Drop from this process the pages of ``tensor``, which :func:`seal_file_maps` must have sealed (this very tensor
    object; any other is left alone and gives 0); the next read maps them again from the file. Return the bytes
    released (0 as well without ``madvise``, or when the kernel refused it)."""
    fns = _libc()
    ref, lo, hi = _sealed.get(id(tensor), (None, 0, 0))
    if fns is None or ref is None or ref() is not tensor or _inner_pages(tensor) != (lo, hi):
        return 0
    if fns[0](ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) != 0:
        err = ctypes.get_errno()
        return _refusal("a memory-mapped embedding shard", OSError(err, os.strerror(err)))
    return hi - lo
