"""The RoG record schema, with validation that names the file, the line and the field.

A KGQA record follows the format of the RoG datasets (``rmanluo/RoG-webqsp``, ``rmanluo/RoG-cwq``)::

    {"id": "WebQTest-0", "question": "...", "answer": ["..."], "q_entity": ["..."],
     "a_entity": ["..."], "graph": [["head", "relation", "tail"], ...]}

Three optional fields carry the output of a KBQA system: ``prediction`` (the proposed answers, a list of strings,
one entry per beam or sample, repeats kept in order), ``confidence`` (one float in ``[0, 1]`` per entry of
``prediction``) and ``prediction_paths`` (one entry per entry of ``prediction``: the list of reasoning paths the
system cited for that answer, usually none or one, each path ``[e0, r1, e1, ..., rn, en]``). Any other key is kept,
untouched, in :attr:`KGQARecord.extra`, so that a record read and written back loses nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from kglightning.data.triple_array import TripleArray, Vocab

#: The version of what validation makes of a record (:meth:`KGQARecord.from_dict`): bump it with any change of what
#: is accepted, refused, normalised or counted, so that records kept from an earlier read (the record store) are not
#: reused.
VALIDATION_VERSION = 1

REQUIRED_FIELDS = ("id", "question", "answer", "q_entity", "a_entity", "graph")
OPTIONAL_FIELDS = ("prediction", "confidence", "prediction_paths")


class RecordError(ValueError):
    """A record that does not follow the schema.

    Args:
        message: what is wrong.
        source: the file (or other origin) the record came from.
        line: the 1-based line (``.jsonl``) or 0-based row index (``.json`` list, parquet, dataset) of the record.
        field: the offending field, or ``None`` when the record as a whole is malformed.
    """

    def __init__(self, message: str, *, source: str = "<record>", line: int | None = None, field: str | None = None):
        self.source = source
        self.line = line
        self.field = field
        self.reason = message
        where = source if line is None else f"{source}:{line}"
        what = f" field '{field}'" if field else ""
        super().__init__(f"{where}:{what} {message}")

    def __reduce__(self):
        # keep the message intact across pickling (DataLoader workers, multiprocessing): the default would
        # call ``RecordError(str(self))`` and prefix the location a second time
        return (_rebuild_record_error, (self.reason, self.source, self.line, self.field))


def _rebuild_record_error(message: str, source: str, line: int | None, field: str | None) -> RecordError:
    return RecordError(message, source=source, line=line, field=field)


def _str_list(value: Any, name: str, err) -> list[str]:
    if isinstance(value, str):
        # a bare string where a list is expected is a common slip in hand-written data; accept it as one item
        return [value]
    if value is None:
        raise err("is null, expected a list of strings", name)
    if not isinstance(value, (list, tuple)):
        raise err(f"expected a list of strings, got {type(value).__name__}", name)
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise err(f"item {i} is {type(item).__name__} ({item!r}), expected a string", name)
        out.append(item)
    return out


def _triples(graph_raw: list | tuple, err, vocab: Vocab | None = None) -> list[tuple[str, str, str]] | TripleArray:
    """``graph_raw`` as ``(head, relation, tail)`` string tuples, or as a :class:`TripleArray` over ``vocab``; the
    checks run in C (``map``/``set``) on the whole list first, and only a bad list is walked triple by triple for the
    error message."""
    if set(map(type, graph_raw)) <= {list, tuple} and set(map(len, graph_raw)) <= {3}:
        flat = list(chain.from_iterable(graph_raw))
        if all(issubclass(k, str) for k in set(map(type, flat))):
            if vocab is not None:
                return TripleArray(vocab.ids(flat).reshape(-1, 3), vocab)
            return list(map(tuple, graph_raw))
    for i, triple in enumerate(graph_raw):
        if not isinstance(triple, (list, tuple)) or len(triple) != 3:
            raise err(f"triple {i} is {triple!r}, expected [head, relation, tail]", "graph")
        if not all(isinstance(x, str) for x in triple):
            raise err(f"triple {i} is {list(triple)!r}, expected three strings", "graph")
    raise AssertionError("unreachable: every triple passed")  # pragma: no cover


def _cited_paths(value: Any, prediction: list[str] | None, err) -> list[list[list[str]]]:
    """``prediction_paths`` checked against ``prediction``: one list of paths per answer, each path an odd number
    (at least 3) of non-empty strings ``[e0, r1, e1, ..., rn, en]``."""
    name = "prediction_paths"
    if not isinstance(value, (list, tuple)):
        raise err(f"expected a list of path lists, one per prediction, got {type(value).__name__}", name)
    if prediction is None:
        raise err("is given without 'prediction'", name)
    if len(value) != len(prediction):
        raise err(f"has {len(value)} entries for {len(prediction)} predictions", name)
    out = []
    for i, paths in enumerate(value):
        if not isinstance(paths, (list, tuple)):
            raise err(f"entry {i} is {type(paths).__name__}, expected a list of paths", name)
        entry = []
        for j, path in enumerate(paths):
            if not isinstance(path, (list, tuple)) or not all(isinstance(x, str) and x for x in path):
                raise err(f"entry {i} path {j} is not a list of non-empty strings", name)
            if len(path) < 3 or len(path) % 2 == 0:
                raise err(f"entry {i} path {j} has {len(path)} items, expected [e0, r1, e1, ...] (odd, >= 3)", name)
            entry.append(list(path))
        out.append(entry)
    return out


@dataclass
class KGQARecord:
    """One question with its retrieved subgraph, in the RoG schema.

    Args:
        id: unique question id.
        question: the natural-language question.
        answer: gold answer names.
        q_entity: topic entities mentioned in the question (names of nodes in ``graph``).
        a_entity: gold answer entities (names of nodes in ``graph`` where the subgraph contains them).
        graph: directed triples ``(head, relation, tail)``; parallel relations are kept.
        prediction: answers proposed by a KBQA system, or ``None``.
        confidence: one confidence in ``[0, 1]`` per entry of ``prediction``, or ``None``.
        extra: every other key of the source record, kept as it was.
        prediction_paths: one entry per entry of ``prediction``, the reasoning paths the system cited for that answer
            (usually none or one), each ``[e0, r1, e1, ..., rn, en]``; ``None`` when the system cites no paths.

    Example:
        >>> r = KGQARecord.from_dict({"id": "q1", "question": "capital of France?", "answer": ["Paris"],
        ...     "q_entity": ["France"], "a_entity": ["Paris"], "graph": [["France", "capital", "Paris"]]})
        >>> r.graph
        [('France', 'capital', 'Paris')]
    """

    id: str
    question: str
    answer: list[str]
    q_entity: list[str]
    a_entity: list[str]
    graph: list[tuple[str, str, str]] | TripleArray
    prediction: list[str] | None = None
    confidence: list[float] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    prediction_paths: list[list[list[str]]] | None = None

    @classmethod
    def from_dict(
        cls, data: Any, *, source: str = "<record>", line: int | None = None, vocab: Vocab | None = None
    ) -> KGQARecord:
        """Validate ``data`` and build a record; raise :class:`RecordError` naming source, line and field. With a
        ``vocab``, the graph is kept as a :class:`~kglightning.data.triple_array.TripleArray` over it."""

        def err(message: str, name: str | None = None) -> RecordError:
            return RecordError(message, source=source, line=line, field=name)

        if not isinstance(data, dict):
            raise err(f"expected a JSON object, got {type(data).__name__}")
        missing = [k for k in REQUIRED_FIELDS if k not in data]
        if missing:
            raise err(f"missing required field(s): {', '.join(missing)}", missing[0])
        rid = data["id"]
        if isinstance(rid, int) and not isinstance(rid, bool):
            rid = str(rid)
        if not isinstance(rid, str) or not rid:
            raise err(f"expected a non-empty string, got {rid!r}", "id")
        question = data["question"]
        if not isinstance(question, str) or not question.strip():
            raise err(f"expected a non-empty string, got {question!r}", "question")
        answer = _str_list(data["answer"], "answer", err)
        q_entity = _str_list(data["q_entity"], "q_entity", err)
        a_entity = _str_list(data["a_entity"], "a_entity", err)
        graph_raw = data["graph"]
        if graph_raw is None:
            graph_raw = []
        if not isinstance(graph_raw, (list, tuple, TripleArray)):
            raise err(f"expected a list of [head, relation, tail] triples, got {type(graph_raw).__name__}", "graph")

        prediction = data.get("prediction")
        if prediction is not None:
            prediction = _str_list(prediction, "prediction", err)
        confidence = data.get("confidence")
        if confidence is not None:
            if not isinstance(confidence, (list, tuple)):
                raise err(f"expected a list of floats, got {type(confidence).__name__}", "confidence")
            if prediction is None:
                raise err("is given without 'prediction'", "confidence")
            if len(confidence) != len(prediction):
                raise err(f"has {len(confidence)} values for {len(prediction)} predictions", "confidence")
            conf = []
            for i, c in enumerate(confidence):
                if isinstance(c, bool) or not isinstance(c, (int, float)) or not math.isfinite(c) or not 0 <= c <= 1:
                    raise err(f"item {i} is {c!r}, expected a number in [0, 1]", "confidence")
                conf.append(float(c))
            confidence = conf
        paths = data.get("prediction_paths")
        if paths is not None:
            paths = _cited_paths(paths, prediction, err)
        # the graph last: its strings join ``vocab`` only once every other field is valid
        graph = graph_raw if isinstance(graph_raw, TripleArray) else _triples(graph_raw, err, vocab)
        extra = {k: v for k, v in data.items() if k not in REQUIRED_FIELDS and k not in OPTIONAL_FIELDS}
        return cls(rid, question, answer, q_entity, a_entity, graph, prediction, confidence, extra, paths)

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict in the RoG schema (optional fields only when set)."""
        out: dict[str, Any] = {
            "id": self.id,
            "question": self.question,
            "answer": list(self.answer),
            "q_entity": list(self.q_entity),
            "a_entity": list(self.a_entity),
            "graph": [list(t) for t in self.graph],
        }
        if self.prediction is not None:
            out["prediction"] = list(self.prediction)
        if self.confidence is not None:
            out["confidence"] = list(self.confidence)
        if self.prediction_paths is not None:
            if self.prediction is None or len(self.prediction_paths) != len(self.prediction):
                # a copy made with dataclasses.replace(record, prediction=...) keeps the old paths: never write them
                n = "no" if self.prediction is None else len(self.prediction)
                raise RecordError(f"has {len(self.prediction_paths)} entries for {n} predictions (set prediction_paths "
                                  "whenever prediction is replaced)", source=f"record {self.id!r}",
                                  field="prediction_paths")  # fmt: skip
            out["prediction_paths"] = [[list(p) for p in paths] for paths in self.prediction_paths]
        out.update(self.extra)
        return out
