"""A content digest of records, read the way they are held: a stored graph as its ``int32`` ids and, once per list,
the vocabulary they index, so that no triple becomes a Python string or a JSON list on the way.

Stages that keep their output by the content of their input (the detection graph rows, the PCST cuts) key it with
:func:`records_digest`. Hashing every graph as JSON (``record.to_dict()``) would build a Python list of three
strings per triple: at WebQSP's size (6.8M triples in a split) that is gigabytes of temporary objects, where the ids
are 81 MB read from the record store's map.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from kglightning.data.records import KGQARecord
from kglightning.data.triple_array import TripleArray, Vocab, release_graphs

__all__ = ["records_digest"]


def records_digest(records: Sequence[KGQARecord], extra: bool = False) -> str:
    """A hex digest of ``records``: each record's fields (id, question, answers, topic entities, predictions,
    confidences, cited paths; with ``extra``, its :attr:`~kglightning.data.records.KGQARecord.extra` too) and its
    triples (a stored graph's ``int32`` ids and, once each, the vocabulary they index; a list of triples as JSON).
    The graphs' pages are given back after (:func:`~kglightning.data.triple_array.release_graphs`).

    Example:
        >>> r = KGQARecord("q1", "capital of France?", ["Paris"], ["France"], ["Paris"], [("France", "capital", "Paris")])
        >>> records_digest([r]) == records_digest([r]) != records_digest([r], extra=True)
        True
    """
    h = hashlib.sha256()
    if extra:
        h.update(b"extra\0")
    vocabs: dict[int, tuple[int, Vocab]] = {}
    for r in records:
        fields = (r.id, r.question, r.answer, r.a_entity, r.q_entity, r.prediction, r.confidence,
                  r.prediction_paths, len(r.graph))  # fmt: skip
        h.update(json.dumps(fields, default=str).encode() + b"\0")
        if extra:
            h.update(json.dumps(r.extra, sort_keys=True, default=str).encode() + b"\0")
        g = r.graph
        if isinstance(g, TripleArray):
            k, _ = vocabs.setdefault(id(g.vocab), (len(vocabs), g.vocab))
            h.update(k.to_bytes(8, "little"))
            h.update(np.ascontiguousarray(g.ids, dtype="<i4").tobytes())
        else:
            h.update(json.dumps([list(t) for t in g]).encode())
    for _, vocab in vocabs.values():
        _hash_strings(h, vocab.to_arrow())
    release_graphs(r.graph for r in records)
    return h.hexdigest()[:32]


def _hash_strings(h: Any, array: pa.Array) -> None:
    """Feed ``array``'s strings to ``h``: its offsets and bytes where Arrow holds them flat, else the strings."""
    array = array.cast(pa.large_string()) if array.type != pa.large_string() else array
    if array.offset:  # a slice: copied flat, so that it hashes as the same strings held flat do
        array = pa.concat_arrays([array])
    n = len(array)
    h.update(n.to_bytes(8, "little"))
    if array.offset == 0 and array.null_count == 0 and n:
        _, offsets_buf, data_buf = array.buffers()
        offsets = np.frombuffer(offsets_buf, dtype="<i8", count=n + 1)
        h.update((offsets - offsets[0]).tobytes())
        h.update(memoryview(data_buf)[int(offsets[0]) : int(offsets[-1])])
        return
    for text in array.to_pylist():  # nulls: each string's length, then its bytes (a null as length -1)
        data = b"" if text is None else text.encode("utf-8", "surrogatepass")
        h.update((-1 if text is None else len(data)).to_bytes(8, "little", signed=True) + data)
