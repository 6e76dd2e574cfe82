"""Checks of stored detection-graph rows (:mod:`~kglightning.datamodules.graph_rows`) before they become graphs.

Rows are read back from a cache folder, which a crash, a full disk, another program or a person can damage. A row
that cannot be the graph it claims to be raises :class:`GraphRowError` naming its record, so that
:class:`~kglightning.datamodules.DetectionDataModule` removes the rows and builds them again instead of training on
them or failing with an unrelated error: :func:`check_nulls` looks for missing values in the whole table at once,
:func:`check_row` for lengths and values that do not fit together in one row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kglightning.datamodules.detection_graphs import GROUNDING_KINDS
from kglightning.evidence.answer_signals import SIGNALS
from kglightning.nn.kgguard import EDGE_FORWARD, EDGE_REVERSE

__all__ = ["GraphRowError", "check_nulls", "check_row"]

_ALWAYS = ("index", "built", "stats")  # never null
_WHEN_BUILT = ("qid", "num_nodes", "compact_reverse", "labelled")  # null only in a row without a graph


class GraphRowError(ValueError):
    """A stored graph row that cannot be a graph (a missing value, an index outside what it indexes, lengths that do
    not agree): damaged or planted rows."""


def _where(table: pa.Table | pa.RecordBatch, r: int) -> str:
    index, qid = table.column("index")[r].as_py(), table.column("qid")[r].as_py()
    return f"graph row of record {index} ({qid!r})"


def _values(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The innermost values of a (nested) list column."""
    while pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = pc.list_flatten(column)
    return column


def check_nulls(table: pa.Table) -> None:
    """Raise :class:`GraphRowError`, naming the first row that has one, when ``table`` holds a missing value where a
    row must have one: any list or list value, and a built row's scalars."""
    lists = [name for name in table.column_names if name not in (*_ALWAYS, *_WHEN_BUILT)]
    built = table.column("built")
    suspect = built.null_count + sum(table.column(n).null_count for n in _ALWAYS)
    suspect += sum(table.column(n).null_count + _values(table.column(n)).null_count for n in lists)
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
    table: pa.Table | pa.RecordBatch, r: int, lists: dict[str, np.ndarray], num_texts: int, entries: int
) -> None:
    """Raise :class:`GraphRowError` when row ``r`` of ``table``, whose list columns are ``lists`` (numpy arrays),
    ``num_texts`` texts and ``entries`` answer entries, is not a graph: a text or node index out of range, lengths
    that disagree (edges, answers and their per-answer columns), an edge or grounding kind that does not exist, or a
    ``compact_reverse`` that is not the number of its leading forward edges."""
    n = int(table.column("num_nodes")[r].as_py())
    edges, answers = len(lists["edge_kind"]), len(table.column("answer_names")[r])
    if entries != answers:
        raise GraphRowError(f"{_where(table, r)}: {entries} answer_entries for {answers} answers")
    bounds = {"node_text": num_texts, "edge_text": num_texts, "ungrounded_text": num_texts, "edge_index": n,
              "topics": n, "answer_index": n, "edge_kind": 3, "answer_grounding": len(GROUNDING_KINDS)}  # fmt: skip
    for name, bound in bounds.items():
        values = lists[name]
        if values.size and (int(values.min()) < 0 or int(values.max()) >= bound):
            raise GraphRowError(f"{_where(table, r)}: {name} holds an index outside [0, {bound})")
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
            raise GraphRowError(f"{_where(table, r)}: {name} holds {len(lists[name])} values where {size} belong")
    if n < 1:
        raise GraphRowError(f"{_where(table, r)}: {n} nodes (a graph has at least its question node)")
    m, kind = int(table.column("compact_reverse")[r].as_py()), lists["edge_kind"]
    mirrored = 1 <= m <= edges and not (kind[:m] != EDGE_FORWARD).any() and not (kind[m:] == EDGE_REVERSE).any()
    if m != -1 and not mirrored:
        raise GraphRowError(f"{_where(table, r)}: compact_reverse {m} is not the count of its leading forward edges")
