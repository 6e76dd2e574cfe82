"""Detection graphs as Arrow rows: built by a cached ``datasets`` map, read back column by column.

:class:`~kglightning.datamodules.DetectionDataModule` builds one graph per question
(:func:`~kglightning.datamodules.detection_graphs.graph_parts`). :func:`build_graph_rows` runs that as a
:func:`~kglightning.data.store.stage_map.cached_map` step: on ``workers`` processes, kept as Arrow files, resumed
where a stopped run left off, and read back whole by the next run with the same inputs.

A row holds a question's graph in the compact form of
:func:`~kglightning.datamodules.graph_forms.compact_graph`, with texts of its own: ``texts`` lists the distinct
strings the graph refers to (node names, relation texts, the question, ungrounded answers), and ``node_text``,
``edge_text`` and ``ungrounded_text`` index that list. The rows so do not depend on an embedding table's numbering
(which depends on what the table held before). :func:`graphs_from_rows` turns them into graphs whose texts are rows of
a table: Arrow finds the distinct texts of all rows and the place of each text among them, each distinct text is
looked up once, and the local indices become table rows with numpy. :func:`row_texts` gives those distinct texts
(what the table must hold). Rows that cannot be their graph (a missing value, an index out of range, lengths that
disagree) raise :class:`~kglightning.datamodules.graph_row_checks.GraphRowError` naming the record.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch_geometric.data import Data

from kglightning.data.records import KGQARecord
from kglightning.data.store.stage_map import stage_state
from kglightning.data.text import RelationView
from kglightning.data.triple_array import release_graphs
from kglightning.datamodules.detection_graphs import DetectionStats, graph_parts
from kglightning.datamodules.graph_forms import GraphParts
from kglightning.datamodules.graph_row_checks import GraphRowError, check_row, check_table
from kglightning.evidence.answer_signals import SIGNALS
from kglightning.nn.kgguard import EDGE_FORWARD, EDGE_REVERSE, EDGE_VIRTUAL

__all__ = [
    "GRAPH_VERSION",
    "GraphRowError",
    "build_graph_rows",
    "check_rows",
    "code_digest",
    "graph_features",
    "graphs_from_rows",
    "records_rows",
    "row_texts",
    "rows_table",
]

#: changes whenever a stored row would come out otherwise (a new field, another graph for the same record)
GRAPH_VERSION = 1
#: the modules whose code decides a graph row: a change to any of them gives new rows (:func:`code_digest`)
GRAPH_CODE = (
    "kglightning.datamodules.graph_rows", "kglightning.datamodules.detection_graphs",
    "kglightning.datamodules.graph_forms", "kglightning.datamodules.text_rows", "kglightning.data.text",
    "kglightning.data.kg",
    "kglightning.data.triple_array", "kglightning.data.records", "kglightning.evidence.answer_signals",
    "kglightning.metrics.functional.qa",
)  # fmt: skip


@functools.cache
def code_digest() -> str:
    """A digest of the source of :data:`GRAPH_CODE`, :data:`GRAPH_VERSION` and the edge kinds' values: part of the
    rows' cache key, so a change of the code that builds them (an upgrade, a local edit) never reads rows the old
    code wrote."""
    h = hashlib.sha256(str((GRAPH_VERSION, EDGE_FORWARD, EDGE_REVERSE, EDGE_VIRTUAL)).encode())  # stored edge kinds
    for name in GRAPH_CODE:
        h.update(Path(importlib.import_module(name).__file__).read_bytes())
    return h.hexdigest()[:16]


# list columns: name -> (Arrow value type, numpy dtype of the stored values, torch dtype of the graph's tensor)
_LISTS: dict[str, tuple[str, Any, torch.dtype]] = {
    "node_text": ("int32", np.int32, torch.int32),
    "edge_index": ("int32", np.int32, torch.int32),  # the two rows of (2, E), one after the other
    "edge_text": ("int32", np.int32, torch.int32),
    "edge_kind": ("int8", np.int8, torch.int8),
    "topics": ("int32", np.int32, torch.long),
    "answer_index": ("int32", np.int32, torch.long),
    "ungrounded_text": ("int32", np.int32, torch.long),
    "answer_grounding": ("int8", np.int8, torch.long),
    "answer_rank": ("float32", np.float32, torch.float),
    "y": ("float32", np.float32, torch.float),
    "proposer_confidence": ("float32", np.float32, torch.float),
    "answer_signals": ("float32", np.float32, torch.float),  # (answers, len(SIGNALS)) row by row
}
_TEXT_COLUMNS = ("node_text", "edge_text", "ungrounded_text")  # local indices into the row's texts


def graph_features() -> Any:
    """The rows' ``datasets.Features`` (:func:`graph_schema`: their Arrow schema)."""
    import datasets

    v = datasets.Value
    return datasets.Features({
        "index": v("int64"), "built": v("bool"), "stats": v("large_string"), "qid": v("string"),
        "num_nodes": v("int64"), "compact_reverse": v("int64"), "labelled": v("bool"),
        "texts": datasets.List(v("string")), "answer_names": datasets.List(v("string")),
        "answer_entries": datasets.List(datasets.List(v("int32"))),
        **{name: datasets.List(v(arrow)) for name, (arrow, _, _) in _LISTS.items()},
    })  # fmt: skip


@functools.cache
def graph_schema() -> pa.Schema:
    """The Arrow schema of :func:`graph_features`, made once (``datasets`` builds it anew on each call, a sixth of
    the time of a served request)."""
    return graph_features().arrow_schema


class _LocalTexts:
    """``text -> index`` into a list of the texts asked for, in the order first asked (one graph's own texts)."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def get(self, text: str, default: Any = None) -> int:
        return self.index.setdefault(text, len(self.index))

    __getitem__ = get


def _list_column(values: Sequence[np.ndarray], dtype: Any) -> pa.ListArray:
    """One list column from each row's values (flat numpy arrays), with one conversion for the whole batch."""
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum([len(v) for v in values], out=offsets[1:])
    flat = np.concatenate(values).astype(dtype, copy=False) if values else np.zeros(0, dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def _row_lists(g: GraphParts) -> dict[str, np.ndarray]:
    """The list columns of a built graph's row, in the compact form of
    :func:`~kglightning.datamodules.graph_forms.compact_graph` (the reverse edges, a mirror of the forward ones, are
    not stored)."""
    src, dst, rel, kind = g.edges(mirror=False)
    arrays = {
        "node_text": g.node_text, "edge_index": np.concatenate([src, dst]), "edge_text": rel, "edge_kind": kind,
        "topics": np.unique(np.asarray(g.topics, dtype=np.int64)), "answer_index": np.asarray(g.answer_nodes),
        "ungrounded_text": np.asarray(g.ungrounded_text), "answer_grounding": np.asarray(g.grounding),
        "answer_rank": np.asarray(g.answer_rank), "y": np.asarray(g.labels),
        "proposer_confidence": np.asarray(g.confidences), "answer_signals": np.asarray(g.answer_signals).reshape(-1),
    }  # fmt: skip
    return {name: arrays[name].astype(dtype).reshape(-1) for name, (_, dtype, _) in _LISTS.items()}


def rows_table(built: Sequence[tuple[int, DetectionStats, GraphParts | None, list[str]]]) -> pa.Table:
    """The rows of ``(record index, counts, graph or None, the graph's texts)``, as a table of
    :func:`graph_features`' schema (a graph's texts are what its ``node_text``, ``edge_text`` and
    ``ungrounded_text`` index)."""
    graphs = [g for _, _, g, _ in built]
    empty = {name: np.zeros(0, dtype) for name, (_, dtype, _) in _LISTS.items()}
    lists = [empty if g is None else _row_lists(g) for g in graphs]

    def scalar(get: Callable[[GraphParts], Any]) -> list[Any]:
        return [None if g is None else get(g) for g in graphs]

    columns = {
        "index": [i for i, *_ in built], "built": [g is not None for g in graphs],
        "stats": [json.dumps(vars(stats)) for _, stats, _, _ in built], "qid": scalar(lambda g: g.qid),
        "num_nodes": scalar(lambda g: g.num_nodes), "compact_reverse": scalar(lambda g: g.compact_reverse),
        "labelled": scalar(lambda g: g.labelled), "texts": [t if g is not None else [] for *_, g, t in built],
        "answer_names": [[] if g is None else g.answer_names for g in graphs],
        "answer_entries": [[] if g is None else g.answer_entries for g in graphs],
        **{name: _list_column([row[name] for row in lists], dtype) for name, (_, dtype, _) in _LISTS.items()},
    }  # fmt: skip
    try:
        return pa.Table.from_pydict(columns, schema=graph_schema())
    except UnicodeEncodeError as err:  # a lone surrogate (a JSON "\ud800" escape): name the record
        for i, _, g, texts in built:
            for text in [*texts, *(g.answer_names if g is not None else []), *([g.qid] if g is not None else [])]:
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError(f"record {i} ({g.qid if g is not None else '?'!r}): the text {text!r} is not "
                                     f"valid Unicode ({err.reason}); fix or drop it in the data") from None  # fmt: skip
        raise


def records_rows(
    records: Sequence[KGQARecord],
    indices: Iterable[int],
    add_reverse_edges: bool,
    ungrounded: Literal["keep", "drop"],
    near: Callable[[KGQARecord], Callable[[str], str | None] | None],
    relation_view: RelationView,
) -> pa.Table:
    """The rows of ``records[i]`` for ``i`` in ``indices`` (``near(record)``: the near-miss matcher of a record's
    nodes, or ``None``): what a split's map stores, and what a service builds for the records it is sent."""
    built = []
    for i in indices:
        record, stats, texts = records[i], DetectionStats(), _LocalTexts()
        g = graph_parts(record, texts, stats, add_reverse_edges, ungrounded, near(record), relation_view)
        built.append((i, stats, g, list(texts.index)))
    return rows_table(built)


def build_graph_rows(batch: dict[str, list]) -> pa.Table:
    """The map step: the rows of the questions ``batch["index"]`` of the records in :func:`stage_state`, a tuple
    ``(records, add_reverse_edges, ungrounded, near, relation_view)`` (:func:`records_rows`)."""
    records, add_reverse_edges, ungrounded, near, relation_view = stage_state()
    table = records_rows(records, batch["index"], add_reverse_edges, ungrounded, near, relation_view)
    release_graphs(records[i].graph for i in batch["index"])  # read for the last time: their pages leave
    return table


def row_stats(ds: Any) -> DetectionStats:
    """The counts of every row of ``ds`` merged (the split's :class:`DetectionStats`).

    Raises:
        GraphRowError: a row's counts are not what :class:`DetectionStats` holds.
    """
    stats = DetectionStats()
    for r, text in enumerate(ds["stats"]):
        try:
            stats.merge(DetectionStats(**json.loads(text)))
        except (ValueError, TypeError) as err:  # JSONDecodeError is a ValueError; an unknown field a TypeError
            raise GraphRowError(f"graph row {r}: its stats are not a DetectionStats ({err})") from None
    return stats


def _table(ds: Any) -> pa.Table:
    """The rows of ``ds`` (a ``datasets.Dataset``, or a table of :func:`records_rows`) as one Arrow table."""
    if isinstance(ds, pa.Table):
        return ds
    return ds.with_format("arrow")[:] if len(ds) else ds.features.arrow_schema.empty_table()


def row_texts(ds: Any) -> pa.Array:
    """The distinct texts the rows of ``ds`` refer to (an Arrow string array, each once).

    Raises:
        GraphRowError: the rows are damaged (:func:`check_rows`).
    """
    table = _table(ds)
    check_table(table)
    return _distinct(pc.list_flatten(table.column("texts")))


def check_rows(ds: Any) -> None:
    """Raise :class:`GraphRowError`, naming the record, when the rows of ``ds`` as a whole are damaged
    (:func:`~kglightning.datamodules.graph_row_checks.check_table`); each row's own checks are made as
    :func:`graphs_from_rows` reads it."""
    check_table(_table(ds))


def _distinct(texts: pa.ChunkedArray) -> pa.Array:
    return pc.unique(texts) if len(texts) else pa.array([], pa.string())


def _encoded(texts: pa.ChunkedArray) -> tuple[pa.Array, np.ndarray]:
    """``(distinct texts, each text's index among them)``."""
    if not len(texts):
        return pa.array([], pa.string()), np.zeros(0, np.int64)
    # two passes: dictionary_encode and unify_dictionaries over this column of many chunks took four times the read
    # time at WebQSP size (11.7 s against 2.9 s) and 425 MiB more peak RSS than unique + index_in
    unique = _distinct(texts)
    return unique, _numpy(pc.index_in(texts, value_set=unique)).astype(np.int64)


def graphs_from_rows(
    ds: Any, text_row: Mapping[str, int], reverse: bool | None = None, check: bool = True
) -> Iterator[tuple[int, Data]]:
    """``(record index, compact graph)`` for the rows of ``ds`` that hold a graph, in order, with texts as rows of
    ``text_row`` (``text -> row``, e.g. an embedding table's index, which must hold :func:`row_texts`); ``reverse``:
    whether the rows were built with reverse edges (``None``: not checked); ``check=False``: the table was checked
    whole already (:func:`check_table`; each row is still checked as it is read)."""
    table = _table(ds)
    if check:
        check_table(table)
    texts = pc.list_flatten(table.column("texts"))
    unique, codes = _encoded(texts)  # each distinct text, and each text's place among them
    found = list(map(text_row.get, unique.to_pylist()))
    if None in found:
        text = unique[found.index(None)].as_py()
        raise KeyError(f"{text!r} has no row in the embedding table: embed the texts of the graph rows first")
    rows_of_text = np.asarray(found, dtype=np.int64)[codes]  # each text's table row, the rows' texts one after another
    text_start = np.concatenate([[0], np.cumsum(_numpy(pc.list_value_length(table.column("texts"))))])
    n = 0
    for batch in table.to_batches():
        lists = {name: _Lists(batch.column(name)) for name in (*_LISTS, "answer_entries")}
        for r, (built, index) in enumerate(zip(batch.column("built").to_pylist(), batch.column("index").to_pylist())):
            if built:
                yield index, _graph(batch, r, lists, rows_of_text[text_start[n + r] : text_start[n + r + 1]], reverse)
        n += batch.num_rows


def _numpy(a: pa.Array | pa.ChunkedArray) -> np.ndarray:
    chunks = a.chunks if isinstance(a, pa.ChunkedArray) else [a]
    return np.concatenate([c.to_numpy(zero_copy_only=False) for c in chunks]) if chunks else np.zeros(0, np.int64)


class _Lists:
    """A list column of a record batch: row ``r``'s values as a numpy array (a copy), with one read of the column."""

    def __init__(self, column: pa.ListArray) -> None:
        self.offsets = column.offsets.to_numpy()
        self.values = column.values
        self._flat: np.ndarray | None = None

    def __call__(self, r: int) -> np.ndarray:
        if self._flat is None:
            self._flat = self.values.to_numpy(zero_copy_only=False)
        return np.array(self._flat[self.offsets[r] : self.offsets[r + 1]])


def _graph(
    batch: pa.RecordBatch, r: int, lists: dict[str, _Lists], text_rows: np.ndarray, reverse: bool | None
) -> Data:
    def cell(name: str) -> Any:
        return batch.column(name)[r].as_py()

    n = cell("num_nodes")
    virtual = n - 1
    arrays = {name: lists[name](r) for name in _LISTS}
    entries = lists["answer_entries"]
    lo, hi = entries.offsets[r], entries.offsets[r + 1]
    check_row(batch, r, arrays, len(text_rows), int(hi - lo), reverse)
    t: Callable[[str], torch.Tensor] = lambda name: torch.from_numpy(arrays[name]).to(_LISTS[name][2])  # noqa: E731
    texts = {name: text_rows[arrays[name]] for name in _TEXT_COLUMNS}
    edge_kind = t("edge_kind")
    texts["edge_text"][edge_kind.numpy() == EDGE_VIRTUAL] = 0  # no text: 0, as built (the model masks it out)
    topic_mask = torch.zeros(n, dtype=torch.bool)
    topic_mask[t("topics")] = True
    answer_index = t("answer_index")
    answer_mask = torch.zeros(n, dtype=torch.bool)
    answer_mask[answer_index] = True
    names = cell("answer_names")
    inner = entries.values  # list<int32> per answer: the row's answers' lists
    return Data(
        num_nodes=n,
        node_text=_narrow(texts["node_text"]),
        topic_mask=topic_mask,
        answer_mask=answer_mask,
        edge_index=t("edge_index").view(2, -1),
        edge_text=_narrow(texts["edge_text"]),
        edge_kind=edge_kind,
        answer_index=answer_index,
        ungrounded_text=torch.from_numpy(texts["ungrounded_text"].astype(np.int64)),
        ungrounded_question_index=torch.full((len(texts["ungrounded_text"]),), virtual, dtype=torch.long),
        answer_grounding=t("answer_grounding"),
        answer_rank=t("answer_rank"),
        num_answer_items=torch.tensor([len(names)]),
        y=t("y"),
        labelled=torch.tensor([cell("labelled")]),
        proposer_confidence=t("proposer_confidence"),
        answer_signals=t("answer_signals").view(len(names), len(SIGNALS)),
        question_index=torch.tensor([virtual]),
        qid=cell("qid"),
        answer_names=names,
        answer_entries=inner.slice(lo, hi - lo).to_pylist(),
        compact_reverse=torch.tensor(cell("compact_reverse")),
    )


def _narrow(rows: np.ndarray) -> torch.Tensor:
    """Table rows as ``int32`` when every one fits (as :func:`~kglightning.datamodules.graph_forms.compact_graph`
    keeps them), else ``int64``."""
    fits = not rows.size or int(rows.max()) < 2**31
    return torch.from_numpy(rows.astype(np.int32 if fits else np.int64))
