"""Giving back the pages of read-only memory maps that a long run has finished reading.

A memory-mapped file (the record store's graphs, a large embedding shard) costs no memory until it is read; each page
read then stays in the process's resident set (RSS) until the kernel needs the room. A stage that reads every
question's graph once, or looks rows up all over a 2 GB embedding table, so ends with the whole files in its RSS:
they are clean pages the kernel can drop, but a job scheduler or a memory limit counts them. ``madvise(MADV_DONTNEED)``
takes the pages out of the process; they stay in the page cache, and the next read of one maps it again (a minor
fault, no disk read while the cache holds it).

Only maps that are never written qualify: dropping a written page of a private map would lose the write. So
:func:`release_array` acts on ``numpy.memmap`` views opened read-only (``mode="r"``) and nothing else, and
:func:`release_tensor` is for tensors that map a file nobody writes (a caller that knows it, as
:class:`~kglightning.data.row_table.RowTable` does for its shard segments). Where the system has no ``madvise``
(Windows) both do nothing and return 0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import os
from collections.abc import Iterable

import numpy as np
import torch

__all__ = ["release_array", "release_arrays", "release_tensor"]

_MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)


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
    done) or the system has no ``madvise``."""
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
            mm.madvise(_MADV_DONTNEED)
            total += len(mm)
    return total


@functools.cache
def _libc_madvise():
    if _MADV_DONTNEED is None or os.name != "posix":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        fn = libc.madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def release_tensor(tensor: torch.Tensor) -> int:
    """Drop from this process the whole pages inside ``tensor``'s storage, which must map a file that is never
    written (``torch.load(path, mmap=True)`` of a file nobody writes): the next read maps them again from the file.
    Return the bytes released (0 for a storage not on the CPU, smaller than a page, or without ``madvise``).

    Calling this on memory that is not such a map loses data (anonymous pages read back as zeros): the caller
    vouches for the tensor."""
    fn = _libc_madvise()
    if fn is None or tensor.device.type != "cpu":
        return 0
    storage = tensor.untyped_storage()
    page = mmap.PAGESIZE
    start, end = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    lo, hi = -(-start // page) * page, end // page * page  # the pages wholly inside the storage
    if hi <= lo:
        return 0
    if fn(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise(MADV_DONTNEED) of {hi - lo} bytes: {os.strerror(err)}")
    return hi - lo
