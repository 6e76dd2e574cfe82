"""Checks of stored detection-graph rows (:mod:`~kglightning.datamodules.graph_rows`) before they become graphs.

Rows are read back from a cache folder, which a crash, a full disk, another program or a person can damage. A row
that cannot be the graph it claims to be raises :class:`GraphRowError` naming its record, so that
:class:`~kglightning.datamodules.DetectionDataModule` removes the rows and builds them again instead of training on
them or failing with an unrelated error: :func:`check_table` validates the whole table at once (Arrow's structure and
UTF-8, missing values at every level, the record numbering, empty rows where there is no graph), :func:`check_row`
one row's lengths and values against each other. Damage that leaves a consistent row (a label flipped, a text
edited) is not detectable without a checksum of the rows, which they do not carry.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kglightning.datamodules.detection_graphs import GROUNDING_KINDS
from kglightning.evidence.answer_signals import SIGNALS
from kglightning.nn.kgguard import EDGE_FORWARD, EDGE_VIRTUAL

__all__ = ["GraphRowError", "check_nulls", "check_row", "check_table"]

_ALWAYS = ("index", "built", "stats")  # never null
_WHEN_BUILT = ("qid", "num_nodes", "compact_reverse", "labelled")  # null only in a row without a graph


class GraphRowError(ValueError):
    """A stored graph row that cannot be a graph (invalid Arrow data, a missing value, an index outside what it
    indexes, lengths that do not agree): damaged rows."""


def _where(table: pa.Table | pa.RecordBatch, r: int) -> str:
    index, qid = table.column("index")[r].as_py(), table.column("qid")[r].as_py()
    return f"graph row of record {index} ({qid!r})"


def _inner_nulls(column: pa.ChunkedArray) -> int:
    """The missing values inside a (nested) list column, at every level below the rows."""
    count = 0
    while pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = pc.list_flatten(column)
        count += column.null_count
    return count


def check_table(table: pa.Table) -> None:
    """Raise :class:`GraphRowError` when ``table`` is not valid Arrow data (offsets, lengths, UTF-8), holds a
    missing value (:func:`check_nulls`), numbers its records otherwise than ``0, 1, ...`` in order, or has a row
    without a graph that holds one's values."""
    try:
        table.validate(full=True)
    except (pa.ArrowException, ValueError) as err:
        raise GraphRowError(f"graph rows that are not valid Arrow data ({err})") from None
    check_nulls(table)
    index = table.column("index").to_numpy()
    wrong = np.flatnonzero(index != np.arange(len(index)))
    if wrong.size:
        r = int(wrong[0])
        raise GraphRowError(f"{_where(table, r)}: stored as row {r} (rows are records 0, 1, ... in order)")
    empty = pc.invert(table.column("built"))
    lists = [name for name in table.column_names if name not in (*_ALWAYS, *_WHEN_BUILT)]
    for name in lists:
        filled = pc.and_(empty, pc.greater(pc.list_value_length(table.column(name)), 0))
        if pc.any(filled).as_py():
            r = pc.index(filled, True).as_py()
            raise GraphRowError(f"{_where(table, r)}: a row without a graph holds {name}")
    named = pc.and_(empty, pc.is_valid(table.column("qid")))
    if pc.any(named).as_py():
        raise GraphRowError(f"{_where(table, pc.index(named, True).as_py())}: a row without a graph holds a qid")


def check_nulls(table: pa.Table) -> None:
    """Raise :class:`GraphRowError`, naming the first row that has one, when ``table`` holds a missing value where a
    row must have one: any list or list value, and a built row's scalars."""
    lists = [name for name in table.column_names if name not in (*_ALWAYS, *_WHEN_BUILT)]
    built = table.column("built")
    suspect = built.null_count + sum(table.column(n).null_count for n in _ALWAYS)
    suspect += sum(table.column(n).null_count + _inner_nulls(table.column(n)) for n in lists)
    suspect += sum(pc.sum(pc.and_(pc.is_null(table.column(n)), pc.fill_null(built, True))).as_py() or 0
                   for n in _WHEN_BUILT)  # fmt: skip
    if not suspect:
        return
    for row in table.to_pylist():  # only damaged rows come here: find and name the first
        missing = [n for n in _ALWAYS if row[n] is None] + [n for n in lists if _has_none(row[n])]
        if row["built"] is not False:
            missing += [n for n in _WHEN_BUILT if row[n] is None]
        if missing:
            index = row["index"]
            raise GraphRowError(f"graph row of record {index} ({row['qid']!r}): {', '.join(missing)} missing (null)")
    raise GraphRowError(f"graph rows hold {suspect} missing (null) values")  # not reached: the scan finds one


def _has_none(value: Any) -> bool:
    return value is None or (isinstance(value, list) and any(map(_has_none, value)))


def check_row(
    table: pa.Table | pa.RecordBatch,
    r: int,
    lists: dict[str, np.ndarray],
    num_texts: int,
    entries: int,
    reverse: bool | None = None,
) -> None:
    """Raise :class:`GraphRowError` when row ``r`` of ``table``, whose list columns are ``lists`` (numpy arrays),
    ``num_texts`` texts and ``entries`` answer entries, is not a graph as the builder writes one: an index out of
    range (a text, a node; an answer or topic entity on the question node), lengths that disagree (edges, answers and
    their per-answer columns), an edge or grounding kind that does not exist, edges not in the order forward then
    the question node's (one to each topic entity), a label other than 0 or 1, or a ``compact_reverse`` other than
    the number of forward edges when reverse edges were made (``reverse``; ``None``: either way) and -1 when not."""
    where = _where(table, r)
    n = int(table.column("num_nodes")[r].as_py())
    if n < 1:
        raise GraphRowError(f"{where}: {n} nodes (a graph has at least its question node)")
    edges, answers = len(lists["edge_kind"]), len(table.column("answer_names")[r])
    if entries != answers:
        raise GraphRowError(f"{where}: {entries} answer_entries for {answers} answers")
    sizes = {
        "node_text": n,
        "edge_index": 2 * edges,
        "edge_text": edges,
        "y": answers,
        "answer_rank": answers,
        "answer_grounding": answers,
        "proposer_confidence": answers,
        "answer_signals": answers * len(SIGNALS),
    }
    sizes["answer_index"] = answers - len(lists["ungrounded_text"])  # fmt: skip
    for name, size in sizes.items():
        if len(lists[name]) != size:
            raise GraphRowError(f"{where}: {name} holds {len(lists[name])} values where {size} belong")
    bounds = {
        "node_text": num_texts,
        "edge_text": num_texts,
        "ungrounded_text": num_texts,
        "edge_index": n,
        "topics": n - 1,
        "answer_index": n - 1,
        "edge_kind": 3,
        "answer_grounding": len(GROUNDING_KINDS),
    }
    for name, bound in bounds.items():  # fmt: skip
        values = lists[name]
        if values.size and (int(values.min()) < 0 or int(values.max()) >= bound):
            raise GraphRowError(f"{where}: {name} holds an index outside [0, {bound})")
    kind, (src, dst) = lists["edge_kind"], lists["edge_index"].reshape(2, -1)
    forward = int((kind == EDGE_FORWARD).sum())
    virtual = kind[forward:]
    if (kind[:forward] != EDGE_FORWARD).any() or (virtual != EDGE_VIRTUAL).any():
        raise GraphRowError(f"{where}: edge_kind is not forward edges then the question node's")
    if (src[forward:] != n - 1).any() or not np.array_equal(np.unique(dst[forward:]), lists["topics"]):
        raise GraphRowError(f"{where}: the question node's edges are not one to each topic entity")
    if forward and max(int(src[:forward].max()), int(dst[:forward].max())) >= n - 1:
        raise GraphRowError(f"{where}: a forward edge touches the question node")
    if ((lists["y"] != 0) & (lists["y"] != 1)).any():
        raise GraphRowError(f"{where}: y holds a label other than 0 or 1")
    if int((lists["answer_grounding"] == len(GROUNDING_KINDS) - 1).sum()) != len(lists["ungrounded_text"]):
        raise GraphRowError(f"{where}: answer_grounding does not count its ungrounded answers")
    m = int(table.column("compact_reverse")[r].as_py())
    allowed = {-1, forward} if reverse is None else {forward if reverse and forward else -1}
    if m not in allowed or m == 0:
        raise GraphRowError(f"{where}: compact_reverse {m} for {forward} forward edges")
