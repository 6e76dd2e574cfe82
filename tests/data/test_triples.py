"""Triples files (TSV, parquet) for a user's own KG: parsing, clear errors, the cached index."""

from __future__ import annotations

import logging
import pickle

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kglightning.data.records import RecordError
from kglightning.data.sources.triples import load_kg, read_triples


def write(tmp_path, text: str, name: str = "kg.tsv"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_tsv_with_header_blank_lines_and_unicode(tmp_path):
    p = write(tmp_path, "Head\tRelation\tTail\nFrance\tcapital\tParis\n\nCôte d'Ivoire\tcapital\tYamoussoukro\n")
    assert read_triples(p) == [("France", "capital", "Paris"), ("Côte d'Ivoire", "capital", "Yamoussoukro")]


@pytest.mark.parametrize(
    ("text", "line", "field", "message"),
    [
        ("a\tr\tb\na\tr\n", 2, None, "expected 3 tab-separated fields"),
        ("a\tr\tb\n\tr\tb\n", 2, "head", "non-empty"),
        ("a\t \tb\n", 1, "relation", "non-empty"),
    ],
)
def test_tsv_errors_name_file_line_and_field(tmp_path, text, line, field, message):
    p = write(tmp_path, text)
    with pytest.raises(RecordError, match=message) as e:
        read_triples(p)
    assert (e.value.source, e.value.line, e.value.field) == (str(p), line, field)


def test_tsv_not_utf8_and_unknown_suffix(tmp_path):
    p = tmp_path / "kg.tsv"
    p.write_bytes(b"a\tr\tb\n\xff\tr\tb\n")
    with pytest.raises(RecordError, match="kg.tsv:2: not valid UTF-8"):
        read_triples(p)
    with pytest.raises(RecordError, match="unsupported KG file type"):
        read_triples(write(tmp_path, "x", "kg.csv"))
    with pytest.raises(FileNotFoundError):
        read_triples(tmp_path / "missing.tsv")


def test_parquet_columns_and_empty_field(tmp_path):
    p = tmp_path / "kg.parquet"
    pq.write_table(pa.table({"subject": ["a", "b"], "predicate": ["r", "s"], "object": ["b", "c"]}), p)
    assert read_triples(p) == [("a", "r", "b"), ("b", "s", "c")]
    pq.write_table(pa.table({"head": ["a", "b"], "relation": ["r", None], "tail": ["b", "c"]}), p)
    with pytest.raises(RecordError, match="kg.parquet:1: field 'relation'"):
        read_triples(p)
    pq.write_table(pa.table({"x": ["a"]}), p)
    with pytest.raises(RecordError, match="expected columns head, relation, tail"):
        read_triples(p)


def test_index_is_cached_and_rebuilt_when_the_file_changes(tmp_path):
    p = write(tmp_path, "a\tr\tb\nb\ts\tc\n")
    cache = tmp_path / "cache"
    kg = load_kg(p, cache_dir=cache)
    assert kg.num_edges == 2 and len(list(cache.glob("*.pkl"))) == 1
    p.write_text("a\tr\tb\n", encoding="utf-8")  # changes size (and mtime): a new key
    assert load_kg(p, cache_dir=cache).num_edges == 1
    again = load_kg(p, cache_dir=cache)  # read from the pickle
    assert again.triples() == [("a", "r", "b")] and len(list(cache.glob("*.pkl"))) == 2


@pytest.mark.parametrize("content", [b"", b"\x80\x04torn", pickle.dumps({"not": "an index"})])
def test_an_unreadable_index_cache_is_rebuilt_with_a_warning(tmp_path, caplog, content):
    p = write(tmp_path, "a\tr\tb\nb\ts\tc\n")
    cache = tmp_path / "cache"
    load_kg(p, cache_dir=cache)
    (pkl,) = cache.glob("*.pkl")
    pkl.write_bytes(content)  # a torn write, or another file under the name
    with caplog.at_level(logging.WARNING):
        kg = load_kg(p, cache_dir=cache)
    assert kg.num_edges == 2 and "cannot be read" in caplog.text
    assert load_kg(p, cache_dir=cache).num_edges == 2  # written again, and read back
