"""A table of float16 embedding rows kept in segments: read-only memory maps of shard files and in-memory buffers.

:class:`~kglightning.data.embeddings.EmbeddingCache` keeps its rows here. A large shard stays a read-only
``numpy.memmap`` of its file (:func:`~kglightning.data.store.embedding_files.read_shard`), so the operating system
pages in the rows a run looks up and can drop them again; smaller blocks are copied into one in-memory buffer that grows by
half when full. Rows are numbered in the order they were appended.
"""

from __future__ import annotations

import mmap
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kglightning.data.store.mapped_pages import release_arrays

__all__ = ["RowTable"]

#: rows gathered at once by :meth:`RowTable.rows` (its float16 temporary: 8,192 x 384 x 2 bytes = 6 MB)
ROWS_AT_ONCE = 8192
#: mapped segments of at least this many bytes in all have their pages given back after each chunk of rows gathered
RELEASE_ABOVE = 256 * 2**20


def _is_map(segment: np.ndarray) -> bool:
    return isinstance(segment, np.memmap) and segment.mode == "r"


def _gather(source: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
    """Rows ``rows`` of a float16 segment (viewed as a tensor, :meth:`RowTable._view`) as float32, gathered and
    widened by torch (several times faster than numpy's fancy indexing and conversion)."""
    return source.index_select(0, torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))).float()


def _remap(filename: str, offset: int, shape: tuple[int, int], first: np.ndarray) -> np.memmap:
    """A mapped segment again, in another process: the same file, offset and shape, checked against its first row
    (a file rewritten meanwhile with another layout is refused, not read as rows)."""
    seg = np.memmap(filename, dtype="<f2", mode="r", offset=offset, shape=shape)
    if not np.array_equal(seg[:1], first, equal_nan=True):
        raise ValueError(f"embedding shard {filename} changed since its rows were mapped; open the cache again")
    return seg


class RowTable:
    """Float16 rows in segments, looked up as float32.

    Args:
        release_above: bytes of memory-mapped segments from which :meth:`rows` gives their pages back after each
            chunk it gathers (``None``: never). The pages stay in the page cache, so a later lookup costs a minor
            fault, not a disk read.

    Example:
        >>> t = RowTable()
        >>> t.append(torch.tensor([[1.0, 2.0], [3.0, 4.0]])), t.append(torch.tensor([[5.0, 6.0]]))
        (0, 2)
        >>> t.rows([2, 0]).tolist(), len(t), t.dim
        ([[5.0, 6.0], [1.0, 2.0]], 3, 2)
    """

    def __init__(self, release_above: int | None = RELEASE_ABOVE) -> None:
        self.release_above = release_above
        self._segments: list[np.ndarray] = []
        self._starts: list[int] = []
        self._tail: np.ndarray | None = None  # the buffer behind the last segment while that one is in memory
        self._views: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # read-only segments as tensors (_view)
        self._rows = 0
        self.dim: int | None = None

    def __len__(self) -> int:
        return self._rows

    @property
    def segments(self) -> list[np.ndarray]:
        """The segments, in row order (for inspection)."""
        return list(self._segments)

    def _check(self, dim: int) -> None:
        if self.dim is not None and dim != self.dim:
            raise ValueError(f"embedding width {dim} differs from the table's {self.dim}")

    def append(self, emb: torch.Tensor | np.ndarray, mapped: bool = False) -> int:
        """Append rows and return the first one's id: with ``mapped``, ``emb`` (a read-only ``numpy.memmap`` of
        float16 rows) as a segment of its own, never copied; else copied (as float16) into the in-memory buffer."""
        if mapped:
            whole = _is_map(emb) and isinstance(emb.base, mmap.mmap) and emb.flags.c_contiguous
            if not (whole and emb.dtype == np.float16 and emb.ndim == 2):
                raise TypeError("a mapped segment must be a whole read-only numpy.memmap of float16 rows (not a view)")
            self._check(emb.shape[1])
            start = self._rows
            self._end_tail()
            self._segments.append(emb)
            self._starts.append(start)
        else:
            emb = emb.detach().cpu().numpy() if isinstance(emb, torch.Tensor) else np.asarray(emb)
            if emb.ndim != 2:
                raise ValueError(f"embedding rows must be 2-D, got shape {tuple(emb.shape)}")
            n = emb.shape[0]
            self.reserve(n, emb.shape[1])
            assert self._tail is not None
            used = self._segments[-1].shape[0]
            self._tail[used : used + n] = emb
            self._segments[-1] = self._tail[: used + n]
            start = self._rows
        self.dim = emb.shape[1]
        self._rows += emb.shape[0]
        return start

    def reserve(self, n: int, dim: int, exact: bool = False) -> None:
        """Room for ``n`` more in-memory rows: exactly that many, or at least half again the buffer's size (so rows
        appended one block at a time cost O(rows) copies in all)."""
        self._check(dim)
        tail = self._tail
        used = 0 if tail is None else self._segments[-1].shape[0]
        if tail is not None and used + n <= tail.shape[0]:
            return
        size = used + n if exact else max(used + n, (0 if tail is None else tail.shape[0]) * 3 // 2, 1024)
        grown = np.empty((size, dim), dtype=np.float16)
        if tail is None:
            self._segments.append(grown[:0])
            self._starts.append(self._rows)
        else:
            grown[:used] = tail[:used]
            self._segments[-1] = grown[:used]
        self._tail = grown

    def _end_tail(self) -> None:
        """Close the in-memory buffer so that a mapped segment can follow it (its unused room given back when that
        is more than an eighth of it)."""
        if self._tail is not None:
            used = self._segments[-1].shape[0]
            if self._tail.shape[0] - used > used // 8:
                self._segments[-1] = self._segments[-1].copy()
            self._tail = None

    def rows(self, ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The float32 rows ``ids`` (any shape; the result has one more dimension, :attr:`dim`). Rows are gathered
        in chunks of :data:`ROWS_AT_ONCE`, so the float16 copy made on the way is one chunk, not the whole result.
        When the mapped segments hold ``release_above`` bytes or more and the call gathers at least a chunk, each
        chunk's pages of them are given back as soon as it is gathered
        (:func:`~kglightning.data.store.mapped_pages.release_arrays`): a batch's rows, scattered over a large table,
        would otherwise bring most of the table into this process's resident memory.

        Raises:
            IndexError: an id outside ``[0, len(self))``.
        """
        ids = torch.as_tensor(ids, dtype=torch.long)
        width = self.dim or 0
        out = torch.empty((ids.numel(), width), dtype=torch.float32)
        flat = ids.reshape(-1).numpy()
        if flat.size:
            lo, hi = int(flat.min()), int(flat.max())
            if lo < 0 or hi >= self._rows:
                raise IndexError(f"row {lo if lo < 0 else hi} is out of range for a table of {self._rows} rows")
        # a gather of a chunk or more: a small one (a question's few rows) would pay for releasing the whole map
        mapped = sum(seg.nbytes for seg in self._segments if _is_map(seg))
        release = self.release_above is not None and mapped >= self.release_above and flat.size >= ROWS_AT_ONCE
        if len(self._segments) == 1:
            seg = self._segments[0]
            for at in range(0, flat.size, ROWS_AT_ONCE):
                out[at : at + ROWS_AT_ONCE] = _gather(self._view(seg), flat[at : at + ROWS_AT_ONCE])
                if release:
                    release_arrays([seg])
        elif flat.size:
            which = np.searchsorted(np.asarray(self._starts), flat, side="right") - 1
            for s in np.unique(which).tolist():
                where, seg = np.flatnonzero(which == s), self._segments[s]
                for at in range(0, where.size, ROWS_AT_ONCE):
                    part = where[at : at + ROWS_AT_ONCE]
                    out.index_copy_(0, torch.from_numpy(part), _gather(self._view(seg), flat[part] - self._starts[s]))
                    if release:
                        release_arrays([seg])
        return out.view(*ids.shape, width)

    def _view(self, segment: np.ndarray) -> torch.Tensor:
        """``segment`` as a tensor sharing its memory. A read-only map's view is made once and kept (with the
        segment, so that its id stays its own): ``torch.from_numpy`` warns about a non-writable array, and silencing
        that on every lookup would reset Python's record of warnings already shown. Nothing writes through it."""
        if segment.flags.writeable:
            return torch.from_numpy(segment)
        kept = self._views.get(id(segment))
        if kept is not None and kept[0] is segment:
            return kept[1]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            view = torch.from_numpy(segment)
        live = {id(seg) for seg in self._segments}
        self._views = {k: v for k, v in self._views.items() if k in live}
        self._views[id(segment)] = (segment, view)
        return view

    def release_pages(self) -> int:
        """Drop the pages of the memory-mapped segments from this process's memory (they stay in the page cache and
        are mapped again when a row on them is looked up); return the bytes released. The maps are read-only, so
        nothing can be lost; the segments in memory are left as they are."""
        return release_arrays(seg for seg in self._segments if _is_map(seg))

    def full(self) -> torch.Tensor:
        """Every row, as one float32 tensor (a copy)."""
        if not self._segments:
            return torch.zeros(0, 0)
        return torch.from_numpy(np.concatenate([s.astype(np.float32) for s in self._segments]))

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a spawned DataLoader worker, a process pool), a mapped segment is its file's name, offset and
        shape, mapped again on the other side; pickling it as an array would copy the whole shard."""
        state = dict(self.__dict__)
        state["_segments"] = [
            ("map", seg.filename, seg.offset, seg.shape, np.array(seg[:1])) if _is_map(seg) else np.array(seg)
            for seg in self._segments
        ]
        state["_tail"] = None  # the in-memory segment travels as its rows; the receiver grows a new buffer
        state["_views"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._segments = [_remap(*seg[1:]) if isinstance(seg, tuple) else seg for seg in state["_segments"]]
        self._views = {}
        self._tail = None
        if self._segments and not _is_map(self._segments[-1]):  # appending grows a copy of the last one
            self._tail = self._segments[-1]
