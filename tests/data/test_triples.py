"""Triples files (TSV, parquet) for a user's own KG: parsing, clear errors, the cached index."""

from __future__ import annotations

import logging
import os
import pickle
import socket
import subprocess
import sys
import time

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


def test_index_is_cached_by_content_and_rebuilt_when_the_content_changes(tmp_path):
    p = write(tmp_path, "a\tr\tb\nb\ts\tc\n")
    cache = tmp_path / "cache"
    kg = load_kg(p, cache_dir=cache)
    (cached,) = cache.glob("*.arrow")
    assert kg.num_edges == 2 and cached.read_bytes()[:6] == b"ARROW1"  # an Arrow file, not a pickle
    os.utime(p, ns=(10**18, 10**18))  # touched: the same content
    copy = write(tmp_path, p.read_text(), name="copy.tsv")
    assert load_kg(copy, cache_dir=cache).digest() == kg.digest() and list(cache.glob("index-*")) == [cached]
    assert (cache / f".{cached.name}.kglightning-entry").is_file()  # kglightning's marker, beside the file
    p.write_text("a\tr\tb\n", encoding="utf-8")  # new content: a new key
    assert load_kg(p, cache_dir=cache).num_edges == 1
    again = load_kg(p, cache_dir=cache)  # read from the cache
    assert again.triples() == [("a", "r", "b")] and len(list(cache.glob("*.arrow"))) == 2


def _foreign_arrow() -> bytes:
    sink = pa.BufferOutputStream()
    table = pa.table({"x": [1]})
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _impostor(cached) -> bytes:
    """A file with the index's schema metadata whose columns are not lists (a reader of ``.values`` fails with
    AttributeError, not a ValueError): damage all the same, set aside."""
    table = pa.table({name: [1] for name in ("entities", "relations", "head", "relation", "tail")})
    table = table.replace_schema_metadata(pa.ipc.open_file(pa.py_buffer(cached.read_bytes())).schema.metadata)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def _out_of_range(cached) -> bytes:
    """The index as written, with a tail id past the last entity (a file altered by someone else)."""
    table = pa.ipc.open_file(pa.py_buffer(cached.read_bytes())).read_all()
    tail = pa.LargeListArray.from_arrays(pa.array([0, 2], pa.int64()), pa.array([1, 99], pa.int32()))
    table = table.set_column(table.column_names.index("tail"), "tail", tail)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("content", ["empty", "torn", "pickle", "foreign", "out of range", "impostor"])
def test_an_unreadable_index_cache_is_rebuilt_with_a_warning(tmp_path, caplog, content):
    p = write(tmp_path, "a\tr\tb\nb\ts\tc\n")
    cache = tmp_path / "cache"
    kg = load_kg(p, cache_dir=cache)
    (cached,) = cache.glob("*.arrow")
    planted = {"empty": lambda: b"", "torn": lambda: cached.read_bytes()[:-40], "foreign": _foreign_arrow,
               "pickle": lambda: pickle.dumps({"not": "an index"}), "out of range": lambda: _out_of_range(cached),
               "impostor": lambda: _impostor(cached)}  # fmt: skip
    cached.write_bytes(planted[content]())
    with caplog.at_level(logging.WARNING):
        again = load_kg(p, cache_dir=cache)
    assert again.triples() == kg.triples() and "cannot be read" in caplog.text
    assert len(list(cache.glob(f"{cached.name}.unreadable-*"))) == 1  # set aside (with its marker), not deleted
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert load_kg(p, cache_dir=cache).triples() == kg.triples()  # written again, and read back
    assert not caplog.text


def test_a_kg_index_left_by_a_killed_writer_is_removed_by_the_next(tmp_path):
    p = write(tmp_path, "a\tr\tb\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    load_kg(p, cache_dir=cache)
    (cached,) = cache.glob("*.arrow")
    orphan = cache / f".{cached.name}.{socket.gethostname()}.{int(dead.stdout)}.tmp"
    orphan.write_bytes(b"\0" * 4096)
    os.utime(orphan, (time.time() - 900,) * 2)  # its writer gone and nothing written for 15 minutes
    cached.unlink()
    load_kg(p, cache_dir=cache)  # the next writer of that index
    assert not orphan.exists() and sorted(f.name for f in cache.iterdir()) == [f".{cached.name}.kglightning-entry",
                                                                              cached.name]  # fmt: skip


def test_an_unsupported_file_type_is_refused_even_when_its_content_was_indexed(tmp_path):
    load_kg(write(tmp_path, "a\tr\tb\n"), cache_dir=tmp_path / "cache")
    same = write(tmp_path, "a\tr\tb\n", name="kg.csv")  # the same bytes under a type read_triples refuses
    with pytest.raises(RecordError, match="unsupported KG file type"):
        load_kg(same, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize("names", [["b", "a"], ["a", "a"]])
def test_from_ids_refuses_names_out_of_order(names):
    from kglightning.data.kg import KGIndex

    with pytest.raises(ValueError, match="not sorted and distinct"):
        KGIndex.from_ids(names, ["r"], [0], [0], [1])


def test_the_index_cache_is_private_under_a_group_writable_umask_and_read_back(tmp_path, caplog):
    p = write(tmp_path, "a\tr\tb\nb\ts\tc\n")
    cache = tmp_path / "cache"
    old = os.umask(0o002)  # the default of ordinary users on many systems
    try:
        kg = load_kg(p, cache_dir=cache)
        (cached,) = cache.glob("*.arrow")
        assert oct(cached.stat().st_mode & 0o777) == "0o600"
        os.chmod(cached, 0o664)  # as an older version, or a copy, may have left it
        with caplog.at_level(logging.WARNING):
            assert load_kg(p, cache_dir=cache).triples() == kg.triples()
        assert "writable by other users" in caplog.text and oct(cached.stat().st_mode & 0o777) == "0o600"
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert load_kg(p, cache_dir=cache).triples() == kg.triples()  # read from the rewritten file
        assert not caplog.text
    finally:
        os.umask(old)


@pytest.mark.parametrize("error", [OSError(24, "Too many open files"), MemoryError()])
def test_an_index_that_cannot_be_read_for_a_system_error_is_kept_and_the_error_raised(tmp_path, monkeypatch, error):
    """Finding 6 of the second review: an error of the system (no file handles, no memory) while the cached index
    is read says nothing about the index: it is raised as it is, and the index is not set aside."""
    from kglightning.data.sources import triples

    p = write(tmp_path, "a\tr\tb\n")
    cache = tmp_path / "cache"
    load_kg(p, cache_dir=cache)
    (cached,) = cache.glob("*.arrow")

    def fail(path):
        raise error

    monkeypatch.setattr(triples, "_read_index", fail)
    with pytest.raises(type(error)):
        load_kg(p, cache_dir=cache)
    assert cached.is_file() and not list(cache.glob("*.unreadable-*"))


def test_an_index_of_a_release_before_markers_is_marked_when_read(tmp_path):
    """Finding 8: an index that a run reads whole and trusts, but that carries no marker, is marked then, so that
    `kglightning cache clean` can remove it in time."""
    from kglightning.data.store.cache_marks import is_marked, marker_of

    p = write(tmp_path, "a\tr\tb\n")
    cache = tmp_path / "cache" / "kg"
    load_kg(p, cache_dir=cache)
    (cached,) = cache.glob("*.arrow")
    marker_of(cached).unlink()
    load_kg(p, cache_dir=cache)
    assert is_marked(cached)
