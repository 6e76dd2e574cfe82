"""A table of float16 embedding rows kept in segments: memory-mapped shard files and in-memory buffers.

:class:`~kglightning.data.embeddings.EmbeddingCache` keeps its rows here. A large shard stays a memory map of its
file, so the operating system pages in the rows a run looks up and can drop them again; smaller blocks are copied
into one in-memory buffer that grows by half when full. Rows are numbered in the order they were appended.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from kglightning.data.mapped_pages import release_tensor, seal_file_maps

__all__ = ["RowTable"]

log = logging.getLogger(__name__)


#: rows gathered at once by :meth:`RowTable.rows` (its float16 temporary: 8,192 x 384 x 2 bytes = 6 MB)
ROWS_AT_ONCE = 8192


class RowTable:
    """Float16 rows in segments, looked up as float32.

    Example:
        >>> t = RowTable()
        >>> t.append(torch.tensor([[1.0, 2.0], [3.0, 4.0]])), t.append(torch.tensor([[5.0, 6.0]]))
        (0, 2)
        >>> t.rows([2, 0]).tolist(), len(t), t.dim
        ([[5.0, 6.0], [1.0, 2.0]], 3, 2)
    """

    def __init__(self) -> None:
        self._segments: list[torch.Tensor] = []
        self._starts: list[int] = []
        self._paths: dict[int, Path] = {}  # segment -> the shard file it maps
        self._unchecked: set[int] = set()  # mapped segments not yet sealed (all checked at once, at the next release)
        self._tail: torch.Tensor | None = None  # the buffer behind the last segment while that one is in memory
        self._rows = 0
        self.dim: int | None = None

    def __len__(self) -> int:
        return self._rows

    @property
    def segments(self) -> list[torch.Tensor]:
        """The segments, in row order (for inspection)."""
        return list(self._segments)

    def _check(self, dim: int) -> None:
        if self.dim is not None and dim != self.dim:
            raise ValueError(f"embedding width {dim} differs from the table's {self.dim}")

    def append(self, emb: torch.Tensor, path: Path | None = None) -> int:
        """Append rows and return the first one's id: ``emb`` itself as a segment when it maps the file ``path``
        (``torch.load(path, mmap=True)``), else copied (as float16) into the in-memory buffer."""
        self._check(emb.shape[1])
        start = self._rows
        if path is not None:
            self._end_tail()
            self._paths[len(self._segments)] = Path(path)
            self._unchecked.add(len(self._segments))
            self._segments.append(emb)
            self._starts.append(start)
        else:
            n = emb.shape[0]
            self.reserve(n, emb.shape[1])
            assert self._tail is not None
            used = self._segments[-1].shape[0]
            self._tail[used : used + n] = emb
            self._segments[-1] = self._tail[: used + n]
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
        grown = torch.empty(size, dim, dtype=torch.float16)
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
                self._segments[-1] = self._segments[-1].clone()
            self._tail = None

    def rows(self, ids: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The float32 rows ``ids`` (any shape; the result has one more dimension, :attr:`dim`). Rows are gathered
        in chunks of :data:`ROWS_AT_ONCE`, so the float16 copy made on the way is one chunk, not the whole result."""
        ids = torch.as_tensor(ids, dtype=torch.long)
        width = self._segments[0].shape[1] if len(self._segments) == 1 else (self.dim or 0)
        out = torch.empty(*ids.shape, width, dtype=torch.float32)
        if not ids.numel():
            return out
        flat, flat_out = ids.reshape(-1), out.view(-1, width)
        if len(self._segments) == 1:  # index_select copies (indexing with one id would give a view of the map)
            seg = self._segments[0]
            for lo in range(0, flat.numel(), ROWS_AT_ONCE):
                flat_out[lo : lo + ROWS_AT_ONCE] = seg.index_select(0, flat[lo : lo + ROWS_AT_ONCE])
            return out
        seg = torch.searchsorted(torch.tensor(self._starts), flat, right=True) - 1
        for s in torch.unique(seg).tolist():
            where = torch.nonzero(seg == s).squeeze(1)
            for lo in range(0, where.numel(), ROWS_AT_ONCE):
                part = where[lo : lo + ROWS_AT_ONCE]
                flat_out.index_copy_(0, part, self._segments[s].index_select(0, flat[part] - self._starts[s]).float())
        return out

    def release_pages(self) -> int:
        """Drop the pages of the memory-mapped segments from this process's memory (they stay in the page cache and
        are mapped again when a row on them is looked up); return the bytes released. Only segments that
        :func:`~kglightning.data.mapped_pages.seal_file_maps` sealed qualify: maps of their file with no written page,
        made read-only (checked, together, at the first release after they were appended). So nothing can be lost;
        the other segments, in memory or not, are left as they are."""
        if self._unchecked:
            ks = sorted(self._unchecked)
            sealed = seal_file_maps(self._segments[k] for k in ks)
            if not all(sealed) and sys.platform.startswith("linux"):
                log.info("%d memory-mapped embedding shard(s) stay resident: their maps hold written pages or could "
                         "not be checked (%s)", sealed.count(False), self._paths[ks[sealed.index(False)]])  # fmt: skip
            self._unchecked.clear()
        return sum(release_tensor(self._segments[k]) for k in sorted(self._paths))

    def full(self) -> torch.Tensor:
        """Every row, as one float32 tensor (a copy)."""
        if not self._segments:
            return torch.zeros(0, 0)
        return torch.cat([s.float() for s in self._segments])

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a spawned DataLoader worker, a process pool), a mapped segment is its file's path, mapped again
        on the other side; pickling it as a tensor would copy the whole shard (into shared memory, with torch's
        multiprocessing pickler)."""
        state = dict(self.__dict__)
        # an in-memory segment is a view of a larger buffer, and torch pickles a view's whole storage: its own rows
        state["_segments"] = [
            self._paths[k] if k in self._paths else seg.clone() for k, seg in enumerate(self._segments)
        ]
        state["_tail"] = None  # the in-memory segment travels as its rows; the receiver grows a new buffer
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._segments = [
            torch.load(seg, weights_only=True, mmap=True)["embeddings"] if isinstance(seg, Path) else seg
            for seg in state["_segments"]
        ]
        self._unchecked = set(self._paths)  # a new map of each file: sealed again
        self._tail = None
        if self._segments and len(self._segments) - 1 not in self._paths:  # appending grows a copy of the last one
            self._tail = self._segments[-1]
