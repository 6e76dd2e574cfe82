"""Embedding-table rows of a vocabulary's strings, looked up once per string for a whole split.

The graphs of a split share one :class:`~kglightning.data.triple_array.Vocab`, and a hub entity or a common relation
appears in thousands of them. :class:`TextRows` maps vocabulary ids to rows of an
:class:`~kglightning.data.embeddings.EmbeddingCache` with one array per vocabulary, filled as graphs ask for ids, so
each string is hashed once per split instead of once per graph that names it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from kglightning.data.text import RelationView, relation_text
from kglightning.data.triple_array import Vocab
from kglightning.metrics.functional.qa import answer_key

__all__ = ["TextRows"]


class TextRows:
    """Rows of ``text_id`` (string -> embedding row) for vocabulary ids: node names as they are, relations as the text
    :func:`~kglightning.data.text.relation_text` writes for a view.

    ``text_id`` may grow between calls (an :class:`~kglightning.data.embeddings.EmbeddingCache` index does) but must
    never change a row it has given; a string without a row is a :class:`KeyError` naming it. The strings' answer
    keys (:meth:`normal_forms`, for matching answers to nodes) are kept the same way.

    Args:
        text_id: string -> row, e.g. ``EmbeddingCache._index``.
        max_vocabs: how many (vocabulary, kind) arrays are kept (the least recently used one is dropped first).
        memo: keep the arrays; ``False`` looks every string up on each call, for a single graph over a large shared
            vocabulary (an array as long as the vocabulary would cost more than the lookups it saves).

    Example:
        >>> v = Vocab(["Paris", "location.country.capital", "France"])
        >>> rows = TextRows({"Paris": 7, "France": 3, "location country capital": 5})
        >>> rows.nodes(v, np.array([2, 0, 2])).tolist(), rows.relations(v, np.array([1])).tolist()
        ([3, 7, 3], [5])
    """

    def __init__(self, text_id: Mapping[str, int], max_vocabs: int = 8, memo: bool = True) -> None:
        self.text_id = text_id
        self.max_vocabs = max_vocabs
        self.memo = memo
        self._memo: dict[tuple[int, str], tuple[Vocab, np.ndarray]] = {}

    def __getitem__(self, text: str) -> int:
        return self.text_id[text]

    def nodes(self, vocab: Vocab, ids: np.ndarray) -> np.ndarray:
        """``int64`` rows of the strings ``vocab.strings[ids]``."""
        return self._rows(vocab, ids, "node")

    def relations(self, vocab: Vocab, ids: np.ndarray, view: RelationView = "readable") -> np.ndarray:
        """``int64`` rows of the relation texts of ``vocab.strings[ids]`` in ``view``."""
        return self._rows(vocab, ids, view)

    def normal_forms(self, vocab: Vocab, ids: np.ndarray) -> list[str]:
        """The :func:`~kglightning.metrics.functional.qa.answer_key`-s of the strings ``vocab.strings[ids]`` (how
        answers are matched to nodes), each string keyed once."""
        ids = np.asarray(ids, dtype=np.int64)
        if not self.memo:
            return [answer_key(s) for s in vocab.take(ids)]
        table = self._table(vocab, "normal", object)
        out = table[ids]
        missing = np.equal(out, None)
        if missing.any():
            fresh = np.unique(ids[missing])
            table[fresh] = [answer_key(s) for s in vocab.take(fresh)]
            out = table[ids]
        return out.tolist()

    def _table(self, vocab: Vocab, kind: str, dtype: type) -> np.ndarray:
        """The memo array of ``kind`` for ``vocab`` (``-1`` or ``None``: not looked up yet), grown to its size."""
        key = (id(vocab), kind)
        entry = self._memo.pop(key, None)
        if entry is None or entry[0] is not vocab:
            entry = (vocab, self._empty(len(vocab), dtype))
        table = entry[1]
        if len(table) < len(vocab):  # the vocabulary grew since
            table = np.concatenate([table, self._empty(len(vocab) - len(table), dtype)])
        self._memo[key] = (vocab, table)  # most recently used last
        while len(self._memo) > self.max_vocabs:
            del self._memo[next(iter(self._memo))]
        return table

    @staticmethod
    def _empty(n: int, dtype: type) -> np.ndarray:
        return np.full(n, -1, dtype=np.int64) if dtype is np.int64 else np.full(n, None, dtype=object)

    def _rows(self, vocab: Vocab, ids: np.ndarray, kind: str) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        if not self.memo:
            return np.asarray(self._lookup(vocab, ids.tolist(), kind), dtype=np.int64)
        table = self._table(vocab, kind, np.int64)
        out = table[ids]
        missing = out < 0
        if missing.any():
            fresh = np.unique(ids[missing])
            table[fresh] = self._lookup(vocab, fresh.tolist(), kind)
            out = table[ids]
        return out

    def _lookup(self, vocab: Vocab, ids: list[int], kind: str) -> list[int]:
        strings = vocab.take(ids)
        texts = strings if kind == "node" else [relation_text(s, kind) for s in strings]
        found = list(map(self.text_id.get, texts))
        if None in found:
            text = texts[found.index(None)]
            raise KeyError(f"{text!r} has no row in the embedding table: embed the split's texts first")
        return found  # type: ignore[return-value]
