"""Counts, answers and paths shared by every predictions format of import-predictions."""

from __future__ import annotations

import json

import pytest

from kglightning.data.records import RecordError
from kglightning.data.sources.prediction_lines import (
    ImportStats,
    parse_path,
    path_triples,
    read_json_objects,
    record_from_paths,
    split_reply,
)


def test_items_of_a_prediction_list_that_are_not_answers_are_dropped_and_counted():
    stats = ImportStats()
    reply = ["Governor", 1961, None, {"a": 1}, ["x"], True, "", "  ", " Lawyer ", "Governor"]
    assert split_reply(reply, stats) == ["Governor", "Lawyer", "Governor"]  # repeats kept, in order
    assert (stats.non_string_items, stats.blank_items) == (5, 2)
    assert split_reply("Governor\n\n  Lawyer \n", stats) == ["Governor", "Lawyer"]
    assert split_reply([3]) == []  # without stats: no counter to fill


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("A -> r -> B", ["A", "r", "B"]),
        (" A -> r -> m.0x -> s -> C ", ["A", "r", "m.0x", "s", "C"]),
        ("A -> r", None),
        ("A -> r -> B -> s", None),
        ("A ->  -> B", None),
        ("A", None),
        ("", None),
    ],
)
def test_a_path_alternates_entities_and_relations(text, path):
    assert parse_path(text) == path


def test_the_graph_of_paths_is_their_distinct_triples_and_the_record_is_validated():
    paths = [["A", "r", "m", "s", "B"], ["A", "r", "m"], ["C", "t", "B"]]
    assert path_triples(paths) == [("A", "r", "m"), ("m", "s", "B"), ("C", "t", "B")]
    stats = ImportStats()
    rec = record_from_paths("q1", "which?", ["B", "Z"], paths, ["B"], origin="test", source="p.jsonl", line=4,
                            stats=stats)  # fmt: skip
    assert (rec.q_entity, rec.a_entity, rec.extra) == (["A", "C"], ["B"], {"source": "test"})
    assert (stats.records, stats.without_paths) == (1, 0)
    with pytest.raises(RecordError) as err:
        record_from_paths("q2", " ", ["B"], [], ["B"], origin="test", source="p.jsonl", line=5, stats=stats)
    assert (err.value.source, err.value.line, err.value.field) == ("p.jsonl", 5, "question")


def test_lines_that_are_not_objects_are_refused_with_their_place(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"id": 1}) + "\n\n" + json.dumps(["id", 2]) + "\n")
    with pytest.raises(RecordError, match=r"p.jsonl:3: is a JSON list, expected an object"):
        list(read_json_objects(path))
