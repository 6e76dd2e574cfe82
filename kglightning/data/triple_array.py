"""Compact graphs: a record's triples as one ``int32`` array over a vocabulary of strings shared by many records.

A RoG graph read from JSON is a list of ``(head, relation, tail)`` tuples of ``str``: every occurrence of a name is
its own string object, so a triple costs about 300 bytes of memory. :class:`TripleArray` keeps the same triples as
an ``(n, 3)`` ``int32`` array (12 bytes a triple) whose ids index a :class:`Vocab` that all the records of a split
share, so a hub entity's name is stored once however many graphs name it.

A :class:`TripleArray` is a ``Sequence[tuple[str, str, str]]``: ``len``, indexing, slicing, iteration and ``==``
against a list of tuples behave as the list would, so code that reads ``record.graph`` needs no change. Code that
wants ids (:class:`~kglightning.data.kg.KGIndex`) reads :attr:`TripleArray.ids` and :attr:`TripleArray.vocab`.
Pickled on its own (a DataLoader worker, a process pool), a :class:`TripleArray` carries only the strings it uses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Any, overload

import numpy as np

from kglightning.data.store.mapped_pages import release_array, release_arrays

__all__ = ["ArrowStrings", "TripleArray", "Vocab", "as_triple_array", "graph_nodes", "node_layout", "release_graphs"]


class Vocab:
    """Strings and their ``int32`` ids, in order of first appearance.

    A vocabulary read from a record store (:meth:`from_arrow`) keeps its strings in an Arrow array (flat buffers,
    memory-mapped: no Python object per string) until a string must be looked up or added (:meth:`ids`,
    :meth:`get`); reading ids back to strings (:meth:`take`, :attr:`strings`) never needs more.

    Example:
        >>> v = Vocab()
        >>> v.ids(["Paris", "capital", "Paris"]).tolist(), v.strings, len(v)
        ([0, 1, 0], ['Paris', 'capital'], 2)
        >>> v.take(np.array([1, 0])), Vocab.from_arrow(v.to_arrow()).take([1])
        (['capital', 'Paris'], ['capital'])
    """

    __slots__ = ("_arrow", "_ids", "_list", "_rank")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        self._list: list[str] = []
        self._ids: dict[str, int] | None = {}
        self._arrow: ArrowStrings | None = None
        self._rank: np.ndarray | None = None
        self.ids(strings)

    @classmethod
    def from_arrow(cls, array: Any) -> Vocab:
        """A vocabulary over an Arrow ``string``/``large_string`` array (no nulls), used as it is."""
        v = cls.__new__(cls)
        v._list, v._ids, v._rank = [], None, None
        v._arrow = ArrowStrings(array)
        return v

    def to_arrow(self) -> Any:
        """The strings as an Arrow ``large_string`` array."""
        import pyarrow as pa

        if self._arrow is not None:
            return self._arrow.array
        return pa.array(self._list, type=pa.large_string())

    @property
    def has_table(self) -> bool:
        """Whether the string-to-id map exists (``False`` for a vocabulary still kept in Arrow: :meth:`ids` and
        :meth:`get` would build it, a Python string per name)."""
        return self._ids is not None

    @property
    def strings(self) -> Sequence[str]:
        """The strings in id order (a list, or a read-only view of the Arrow array)."""
        return self._arrow if self._arrow is not None else self._list

    def __len__(self) -> int:
        return len(self._arrow) if self._arrow is not None else len(self._list)

    def _table(self) -> dict[str, int]:
        """The string-to-id map, built (and the strings made a list) on first need."""
        if self._ids is None:
            assert self._arrow is not None
            self._list = self._arrow.array.to_pylist()
            self._arrow = None
            self._ids = {s: i for i, s in enumerate(self._list)}
        return self._ids

    def ids(self, strings: Iterable[str]) -> np.ndarray:
        """The ids of ``strings`` (new strings are added), as an ``int32`` array."""
        strings = strings if isinstance(strings, list) else list(strings)
        if not strings:
            return np.zeros(0, dtype=np.int32)
        table = self._table()
        out = list(map(table.get, strings))  # known strings in one C-level pass
        if None in out:  # add the new ones in first-appearance order, then look every string up again
            fresh = dict.fromkeys(s for s, i in zip(strings, out) if i is None)
            table.update(zip(fresh, range(len(self._list), len(self._list) + len(fresh))))
            self._list.extend(fresh)
            out = list(map(table.__getitem__, strings))
        if len(self._list) > np.iinfo(np.int32).max:
            raise OverflowError("a vocabulary holds at most 2**31 - 1 strings")
        return np.asarray(out, dtype=np.int32)

    def get(self, string: str) -> int | None:
        """The id of ``string``, or ``None`` when the vocabulary does not hold it (nothing is added)."""
        return self._table().get(string)

    def take(self, ids: np.ndarray | Sequence[int]) -> list[str]:
        """The strings of ``ids``, in their order."""
        if self._arrow is not None:
            return self._arrow.take(ids)
        s = self._list
        return [s[i] for i in (ids.tolist() if isinstance(ids, np.ndarray) else ids)]

    def sort_rank(self) -> np.ndarray:
        """``rank[i]``: the place of ``strings[i]`` in sorted order, for ``i`` below ``len(rank)``.

        Sorting per graph by these integers gives the order ``sorted`` gives the strings, without comparing strings
        (scattered over a large heap, that is most of the cost). Computed once, and again when the vocabulary has
        doubled since; strings added after it are not covered (callers compare those as strings). An Arrow
        vocabulary sorts in Arrow (UTF-8 byte order, which is code point order: the order of ``sorted``).
        """
        n = len(self)
        if self._rank is None or n > 2 * len(self._rank):
            if self._arrow is not None:
                import pyarrow.compute as pc

                order = pc.array_sort_indices(self._arrow.array).to_numpy().astype(np.int64)
            else:
                order = np.array(sorted(range(n), key=self._list.__getitem__), dtype=np.int64)
            rank = np.empty(n, dtype=np.int64)
            rank[order] = np.arange(n, dtype=np.int64)
            self._rank = rank
        return self._rank

    def __getstate__(self) -> list[str]:
        return list(self._list) if self._arrow is None else self._arrow.array.to_pylist()

    def __setstate__(self, strings: list[str]) -> None:
        self._list = list(strings)
        self._arrow = None
        self._ids = {s: i for i, s in enumerate(self._list)}
        self._rank = None


class ArrowStrings(Sequence):
    """A read-only ``Sequence[str]`` over an Arrow string array: an item is decoded from the array's flat buffers
    when asked for; :meth:`take` decodes many at once."""

    __slots__ = ("array", "_data", "_offsets")

    def __init__(self, array: Any) -> None:
        import pyarrow as pa

        if isinstance(array, pa.ChunkedArray):  # one chunk is used as it is (combine_chunks would copy it)
            array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
        if array.type == pa.string():
            array = array.cast(pa.large_string())
        if array.type != pa.large_string() or array.null_count:
            raise ValueError(
                f"expected an Arrow string array without nulls, got {array.type} ({array.null_count} nulls)"
            )
        self.array = array
        _, offsets, data = array.buffers()
        self._offsets = np.frombuffer(offsets, dtype=np.int64)[array.offset : array.offset + len(array) + 1]
        self._data = memoryview(data) if data is not None else memoryview(b"")

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(range(*i.indices(len(self))))
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("vocabulary index out of range")
        return str(self._data[self._offsets[i] : self._offsets[i + 1]], "utf-8")

    def __iter__(self) -> Iterator[str]:
        return iter(self.array.to_pylist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ArrowStrings):
            return self.array.equals(other.array)
        if isinstance(other, (list, tuple)):
            return len(other) == len(self) and self.array.to_pylist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ArrowStrings({len(self)} strings)"

    def take(self, ids: np.ndarray | Sequence[int]) -> list[str]:
        import pyarrow as pa

        idx = np.asarray(ids, dtype=np.int64)
        if idx.size and int(idx.min()) < 0:  # negative ids count from the end, as a list's do
            idx = np.where(idx < 0, idx + len(self), idx)
        return self.array.take(pa.array(idx)).to_pylist() if idx.size else []

    def __contains__(self, value: object) -> bool:
        import pyarrow.compute as pc

        return isinstance(value, str) and pc.index(self.array, value).as_py() >= 0


class TripleArray:
    """A graph's ``(head, relation, tail)`` triples as ids over a shared :class:`Vocab` (see the module docstring).

    It has the read-only sequence protocol but is deliberately not a ``collections.abc.Sequence``: utilities that
    walk and rebuild nested collections (Lightning's ``move_data_to_device`` on a batch of records) treat it as one
    value instead of descending into every triple.

    Args:
        ids: ``(n, 3)`` integer array of vocabulary ids.
        vocab: the vocabulary the ids index.

    Example:
        >>> g = TripleArray.from_triples([("France", "capital", "Paris"), ("Paris", "in", "France")], Vocab())
        >>> len(g), g[0], g[-1], list(g) == [("France", "capital", "Paris"), ("Paris", "in", "France")]
        (2, ('France', 'capital', 'Paris'), ('Paris', 'in', 'France'), True)
        >>> g == [("France", "capital", "Paris"), ("Paris", "in", "France")], g[:1]
        (True, [('France', 'capital', 'Paris')])
    """

    __slots__ = ("ids", "vocab")

    def __init__(self, ids: np.ndarray, vocab: Vocab) -> None:
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[1] != 3 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"ids must be an (n, 3) integer array, got shape {ids.shape} of {ids.dtype}")
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= len(vocab)):
            raise ValueError(f"ids must lie in [0, {len(vocab)}) (the vocabulary's size)")
        self.ids = ids.astype(np.int32, copy=False)
        self.vocab = vocab

    @classmethod
    def view(cls, ids: np.ndarray, vocab: Vocab) -> TripleArray:
        """A graph over ``ids`` as they are (e.g. a slice of a memory map), unchecked and uncopied: for ids this
        package wrote itself (:mod:`~kglightning.data.store.record_store`); checking them would read every page."""
        graph = cls.__new__(cls)
        graph.ids, graph.vocab = ids, vocab
        return graph

    @classmethod
    def from_triples(cls, triples: Sequence[Sequence[str]], vocab: Vocab) -> TripleArray:
        """Encode ``triples`` (three strings each; not checked here) with ``vocab``, adding new strings to it."""
        return cls(vocab.ids(chain.from_iterable(triples)).reshape(-1, 3), vocab)

    def __len__(self) -> int:
        return self.ids.shape[0]

    def _tuples(self, rows: np.ndarray) -> list[tuple[str, str, str]]:
        flat = self.vocab.take(rows.reshape(-1))
        return list(zip(flat[0::3], flat[1::3], flat[2::3]))

    @overload
    def __getitem__(self, i: int) -> tuple[str, str, str]: ...
    @overload
    def __getitem__(self, i: slice) -> list[tuple[str, str, str]]: ...
    def __getitem__(self, i):
        if isinstance(i, slice):  # a slice is a plain list, as slicing the list of tuples would give
            return self._tuples(self.ids[i])
        h, r, t = self.vocab.take(self.ids[i])
        return h, r, t

    def __iter__(self) -> Iterator[tuple[str, str, str]]:
        return iter(self._tuples(self.ids))

    def __reversed__(self) -> Iterator[tuple[str, str, str]]:
        return reversed(self._tuples(self.ids))

    def __contains__(self, triple: object) -> bool:
        if not isinstance(triple, tuple) or len(triple) != 3 or not all(isinstance(x, str) for x in triple):
            return False  # as for the list of string tuples: nothing else is an element
        ids = [self.vocab.get(x) for x in triple]
        return None not in ids and bool((self.ids == np.asarray(ids, dtype=np.int32)).all(axis=1).any())

    def tolist(self) -> list[tuple[str, str, str]]:
        """The triples as a list of string tuples."""
        return self._tuples(self.ids)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TripleArray):
            if other.vocab is self.vocab:
                return np.array_equal(self.ids, other.ids)
            return len(self) == len(other) and self.tolist() == other.tolist()
        if isinstance(other, list):  # as the list of tuples compares: element by element, a list is no tuple
            return len(self) == len(other) and self.tolist() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-looking, like the list it stands for

    def __add__(self, other: list) -> list:
        return self.tolist() + (other.tolist() if isinstance(other, TripleArray) else other)

    def __radd__(self, other: list) -> list:
        return other + self.tolist()

    def __repr__(self) -> str:
        if len(self) > 6:
            head = ", ".join(map(repr, self[:3]))
            return f"TripleArray([{head}, ... {len(self) - 3} more])"
        return f"TripleArray({self.tolist()!r})"

    def release_pages(self) -> int:
        """When the triples are a view of a read-only memory map (a graph of the record store), drop the pages of the
        whole map from this process's memory (:func:`~kglightning.data.store.mapped_pages.release_array`): a stage that has
        read a question's graph for the last time calls it, so that its RSS does not grow to the whole split's graphs.
        Returns the bytes of the map, 0 for triples in memory."""
        return release_array(self.ids)

    def __reduce__(self) -> tuple[Any, ...]:
        # alone in a pickle, carry only the strings this graph uses (not the whole shared vocabulary)
        used, local = np.unique(self.ids, return_inverse=True)
        strings = self.vocab.take(used)
        return (_rebuild, (strings, local.reshape(-1, 3).astype(np.int32)))


def _rebuild(strings: list[str], ids: np.ndarray) -> TripleArray:
    return TripleArray(ids, Vocab(strings))


def release_graphs(graphs: Iterable[Sequence[Sequence[str]]]) -> int:
    """:meth:`TripleArray.release_pages` once for each distinct map behind ``graphs`` (records' graphs a stage has
    read for the last time; lists of triples are skipped); returns the bytes of the maps released."""
    return release_arrays(g.ids for g in graphs if isinstance(g, TripleArray))


def graph_nodes(graph: Sequence[Sequence[str]]) -> set[str]:
    """The names of the heads and tails of ``graph`` (a :class:`TripleArray` or a list of triples).

    Example:
        >>> sorted(graph_nodes([("France", "capital", "Paris")])), sorted(graph_nodes(TripleArray.from_triples(
        ...     [("France", "capital", "Paris")], Vocab())))
        (['France', 'Paris'], ['France', 'Paris'])
    """
    if isinstance(graph, TripleArray):
        return set(graph.vocab.take(np.unique(graph.ids[:, [0, 2]])))
    return {n for t in graph for n in (t[0], t[2])}


def as_triple_array(graph: Sequence[Sequence[str]]) -> TripleArray:
    """``graph`` as a :class:`TripleArray` (itself when it is one; a list of triples gets its own vocabulary)."""
    return graph if isinstance(graph, TripleArray) else TripleArray.from_triples(graph, Vocab())


def node_layout(graph: TripleArray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The graph's distinct triples and nodes, both in order of first appearance, as arrays.

    Returns:
        ``(triples, nodes, src, dst)``: ``triples`` the ``(m, 3)`` vocabulary ids of the distinct triples (an exact
        repeat is dropped), ``nodes`` the vocabulary ids of the heads and tails in order of first appearance
        (``h0, t0, h1, t1, ...``), and ``src``/``dst`` each distinct triple's head and tail as positions in ``nodes``.

    Example:
        >>> g = TripleArray.from_triples([("b", "r", "a"), ("b", "r", "a"), ("a", "s", "c")], Vocab())
        >>> triples, nodes, src, dst = node_layout(g)
        >>> [g.vocab.strings[i] for i in nodes], src.tolist(), dst.tolist(), len(triples)
        (['b', 'a', 'c'], [0, 1], [1, 2], 2)
    """
    ids = graph.ids
    if not len(ids):
        empty = np.zeros(0, dtype=np.int64)
        return ids, empty, empty, empty
    if int(ids.max()) < 1 << 21:  # three ids in one int64 key: a 1-D unique, several times faster than axis=0
        key = (ids[:, 0].astype(np.int64) << 42) | (ids[:, 1].astype(np.int64) << 21) | ids[:, 2]
        _, first = np.unique(key, return_index=True)
    else:
        _, first = np.unique(ids, axis=0, return_index=True)
    triples = ids[np.sort(first)]
    ends = triples[:, [0, 2]].reshape(-1)
    uniq, first_end = np.unique(ends, return_index=True)
    order = np.argsort(first_end, kind="stable")  # node k is uniq[order[k]]
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return triples, uniq[order], rank[np.searchsorted(uniq, triples[:, 0])], rank[np.searchsorted(uniq, triples[:, 2])]
