"""What every predictions format of ``kglightning import-predictions`` shares: counts, field checks, answers, paths.

A KGQA system's predictions file has one JSON object per line with at least ``id`` and ``prediction``. The format
readers (:mod:`~kglightning.data.sources.prompt_predictions` for RoG / GNN-RAG prompts,
:mod:`~kglightning.data.sources.gcr_predictions` for GCR's beams) and the import itself
(:mod:`~kglightning.data.sources.predictions_import`) take their lines, answers and paths from here, and count what
they keep and drop in one :class:`ImportStats`, so that nothing is dropped without a number in the summary.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.sources.json_lines import iter_json_lines

__all__ = [
    "ARROW",
    "ImportStats",
    "field_of",
    "gold_answers",
    "parse_path",
    "path_triples",
    "question_id",
    "read_json_objects",
    "record_from_paths",
    "split_reply",
    "validated",
]

ARROW = " -> "
_EXAMPLES = 5


@dataclass
class ImportStats:
    """The counts of an import (every one is printed in the summary of ``kglightning import-predictions``).

    Attributes:
        lines: prediction lines read (JSON objects).
        records: records built from a line on its own (graph from the line's paths).
        answers: entries of ``prediction`` kept (one per answer of a reply, one per beam answer; repeats kept).
        non_string_items: items of a ``prediction`` list that were not strings (numbers, null, objects): dropped.
        blank_items: items of a ``prediction`` list that were empty or blank strings: dropped.
        paths: paths read from prompts' ``Reasoning Paths:`` blocks.
        malformed_paths: lines of such a block that were not a path (skipped).
        without_paths: records built with an empty graph (their answers are all ungrounded).
        beams: GCR beams read.
        beams_without_answer: GCR beams with no ``# Answer:`` part, or an empty one (skipped).
        cited_paths: reasoning paths GCR beams cited that parsed (kept in ``prediction_paths``).
        unparsed_paths: reasoning paths of GCR beams that did not parse (kept out of ``prediction_paths``).
        records_read: records read from the ``--records`` folder.
        records_without_prediction: of those, records no prediction line names (left out).
        unknown_ids: prediction lines whose id is in no record (skipped with ``--on-missing skip``).
        formats: the format of each input file (``prompt``, ``gcr`` or ``plain``).
    """

    lines: int = 0
    records: int = 0
    answers: int = 0
    non_string_items: int = 0
    blank_items: int = 0
    paths: int = 0
    malformed_paths: int = 0
    without_paths: int = 0
    beams: int = 0
    beams_without_answer: int = 0
    cited_paths: int = 0
    unparsed_paths: int = 0
    records_read: int = 0
    records_without_prediction: int = 0
    unknown_ids: int = 0
    formats: dict[str, str] = field(default_factory=dict)
    malformed_examples: list[str] = field(default_factory=list)
    unparsed_examples: list[str] = field(default_factory=list)

    def example(self, kind: str, text: str) -> None:
        """Keep ``text`` (cut to 200 characters) as one of the first examples of ``kind`` (``malformed`` or
        ``unparsed``)."""
        kept = self.malformed_examples if kind == "malformed" else self.unparsed_examples
        if len(kept) < _EXAMPLES:
            kept.append(text[:200])


def split_reply(reply: str | Sequence[Any], stats: ImportStats | None = None) -> list[str]:
    """The answers of an LLM reply: its non-empty lines, stripped (a list is taken as already split; its items that
    are not strings, or are blank, are dropped and counted in ``stats``).

    Example:
        >>> stats = ImportStats()
        >>> split_reply(["Paris", 3, None, "  ", "Paris "], stats), stats.non_string_items, stats.blank_items
        (['Paris', 'Paris'], 2, 1)
    """
    if isinstance(reply, str):
        return [s.strip() for s in reply.split("\n") if s.strip()]
    out = []
    for item in reply:
        if not isinstance(item, str):
            if stats is not None:
                stats.non_string_items += 1
        elif item.strip():
            out.append(item.strip())
        elif stats is not None:
            stats.blank_items += 1
    return out


def parse_path(text: str) -> list[str] | None:
    """``"e0 -> r1 -> e1 ..."`` as ``[e0, r1, e1, ...]``; ``None`` unless it alternates entities and relations (an odd
    number, at least 3, of non-empty parts).

    Example:
        >>> parse_path(" Jamaica -> location.country.languages_spoken -> Jamaican English ")
        ['Jamaica', 'location.country.languages_spoken', 'Jamaican English']
        >>> parse_path("Jamaica -> location.country.languages_spoken") is None
        True
    """
    parts = [p.strip() for p in text.split(ARROW)]
    if len(parts) < 3 or len(parts) % 2 == 0 or not all(parts):
        return None
    return parts


def path_triples(paths: Sequence[Sequence[str]]) -> list[tuple[str, str, str]]:
    """The distinct ``(head, relation, tail)`` triples of ``paths``, in the order they first occur."""
    return list(dict.fromkeys((p[i], p[i + 1], p[i + 2]) for p in paths for i in range(0, len(p) - 2, 2)))


def field_of(row: dict[str, Any], name: str, kind: type | tuple[type, ...], *, source: str, line: int | None) -> Any:
    """``row[name]``, or a :class:`RecordError` naming the source, the line and the field when it is missing or not
    of type ``kind``."""
    if name not in row:
        raise RecordError("is missing", source=source, line=line, field=name)
    if not isinstance(row[name], kind):
        raise RecordError(f"has type {type(row[name]).__name__}", source=source, line=line, field=name)
    return row[name]


def question_id(row: dict[str, Any], *, source: str, line: int | None) -> str:
    """The line's ``id`` as a string (an integer id is accepted; a boolean is not)."""
    qid = field_of(row, "id", (str, int), source=source, line=line)
    if isinstance(qid, bool):
        raise RecordError("has type bool", source=source, line=line, field="id")
    return str(qid)


def gold_answers(row: dict[str, Any], *, source: str, line: int | None) -> list[str]:
    """The line's ``ground_truth``: a list of strings (a bare string is one answer)."""
    gold = field_of(row, "ground_truth", (list, str), source=source, line=line)
    gold_list = [gold] if isinstance(gold, str) else list(gold)
    bad = [g for g in gold_list if not isinstance(g, str)]
    if bad:
        raise RecordError(f"holds {bad[0]!r} ({type(bad[0]).__name__}), expected strings", source=source, line=line,
                          field="ground_truth")  # fmt: skip
    return gold_list


def record_from_paths(
    qid: str,
    question: str,
    gold: list[str],
    graph_paths: Sequence[Sequence[str]],
    prediction: list[str],
    prediction_paths: list[list[list[str]]] | None = None,
    *,
    origin: str,
    source: str,
    line: int | None,
    stats: ImportStats | None = None,
) -> KGQARecord:
    """A validated record of one line whose graph is the triples of ``graph_paths``: ``q_entity`` is the paths'
    first entities, ``a_entity`` the gold answers that are nodes of the graph, and ``extra`` notes where the graph
    came from (``{"source": origin}``).

    Raises:
        RecordError: the record does not follow the schema (see :func:`validated`).
    """
    triples = path_triples(graph_paths)
    nodes = {n for h, _, t in triples for n in (h, t)}
    record = KGQARecord(
        id=qid,
        question=question,
        answer=gold,
        q_entity=list(dict.fromkeys(p[0] for p in graph_paths)),
        a_entity=[g for g in gold if g in nodes],
        graph=triples,
        prediction=prediction,
        extra={"source": origin},
        prediction_paths=prediction_paths,
    )
    record = validated(record, source=source, line=line)
    if stats is not None:
        stats.records += 1
        stats.without_paths += not triples
    return record


def validated(record: KGQARecord, *, source: str, line: int | None) -> KGQARecord:
    """``record`` checked as :func:`~kglightning.data.sources.loaders.read_records` will check it when it is read
    back (an empty question, a malformed field), so that the error names the input's file and line now.

    Raises:
        RecordError: naming ``source``, ``line`` and the field.
    """
    return KGQARecord.from_dict(record.to_dict(), source=source, line=line)


def read_json_objects(path: str | os.PathLike, stats: ImportStats | None = None) -> Iterator[tuple[int, dict]]:
    """``(line, object)`` for every non-blank line of a predictions jsonl.

    Raises:
        RecordError: naming the file and the line, for a line that is not UTF-8, not JSON (a number too long to
            read and nesting too deep included) or not a JSON object.
    """
    source = str(path)
    for line, value in iter_json_lines(path, source):
        if isinstance(value, RecordError):
            raise value
        if not isinstance(value, dict):
            raise RecordError(f"is a JSON {type(value).__name__}, expected an object", source=source, line=line)
        if stats is not None:
            stats.lines += 1
        yield line, value
