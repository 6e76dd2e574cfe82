"""The record store's defects that a review reproduced, each reproduced here: a full cache disk, a planted pickle, a
killed writer's folder, duplicate stores of one file, and a key that did not change with validation."""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kglightning.data.records import RecordError
from kglightning.data.sources.loaders import read_records
from kglightning.data.store import record_store
from kglightning.data.store.cache_marks import mark_folder
from kglightning.data.store.record_store import store_folder
from kglightning.data.store.temporaries import remove_abandoned

ROOT = Path(__file__).resolve().parents[2]


def _write(path: Path, questions: int = 6, triples: int = 3) -> Path:
    rows = [
        {"id": f"q{i}", "question": f"question {i}?", "answer": [f"e{i}"], "q_entity": ["t"], "a_entity": [f"e{i}"],
         "graph": [["t", f"r{j % 7}", f"e{i}-{j}"] for j in range(triples)]}
        for i in range(questions)
    ]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(root))
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    monkeypatch.setattr(record_store, "MAP_FROM_BYTES", 0)  # mapped as a large store is
    return root


def _stores(root: Path) -> list[Path]:
    return sorted(p for p in (root / "records").iterdir() if p.is_dir() and (p / "meta.json").is_file())


class _Plant:
    """A pickle payload that leaves a file behind when it is unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def test_a_full_cache_disk_gives_a_warning_and_the_records(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(small)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    try:
        data = _write(tmp_path / "big.jsonl", questions=20, triples=2000)  # a store of about 1 MB: no room for it
        code = "from kglightning.data.sources.loaders import read_records; print(len(read_records(__import__('sys').argv[1])))"
        env = dict(os.environ, KGLIGHTNING_CACHE=str(small), KGLIGHTNING_RECORD_STORE_MIN_MB="0", PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-c", code, str(data)], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, f"exit {proc.returncode}: {proc.stderr[-2000:]}"  # not killed by SIGBUS
        assert proc.stdout.strip() == "20" and "could not keep the records" in proc.stderr
        leftovers = [p.name for p in (small / "records").iterdir() if p.name.endswith(".tmp")]
        assert leftovers == []  # the failed write left nothing behind
    finally:
        subprocess.run(["umount", str(small)], capture_output=True)


def test_no_pickle_is_read_from_the_store(cache, tmp_path):
    path = _write(tmp_path / "train.jsonl")
    first = read_records(path)
    folder = store_folder(path, None, "raise", None)
    marker = tmp_path / "planted"
    (folder / "records.pkl").write_bytes(pickle.dumps(_Plant(marker)))  # where the old store kept its pickle
    again = read_records(path)
    assert not marker.exists() and list(again) == list(first)
    assert {p.name for p in folder.iterdir()} >= {"records.arrow", "vocab.arrow", "meta.json"}
    for p in (cache, cache / "records", folder):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p


def test_no_pickle_is_read_from_the_kg_index_cache(cache, tmp_path, caplog):
    from kglightning.data.sources.triples import _cache_file, load_kg

    kg_file = tmp_path / "kg.tsv"
    kg_file.write_text("a\tr\tb\nb\ts\tc\n", encoding="utf-8")
    kg = load_kg(kg_file)
    cached = _cache_file(kg_file, cache / "kg")
    assert cached.is_file() and stat.S_IMODE(cached.parent.stat().st_mode) == 0o700
    marker = tmp_path / "planted"
    cached.write_bytes(pickle.dumps(_Plant(marker)))  # a pickle under the index's own name
    os.chmod(cached, 0o666)
    with caplog.at_level(logging.WARNING):
        again = load_kg(kg_file)
    assert not marker.exists() and "writable by other users" in caplog.text and again.triples() == kg.triples()
    assert cached.read_bytes()[:6] == b"ARROW1" and stat.S_IMODE(cached.stat().st_mode) == 0o600  # written anew
    cached.write_bytes(pickle.dumps(_Plant(marker)))
    os.chmod(cached, 0o600)  # this user's own file, planted all the same: read as Arrow, refused, rebuilt
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        again = load_kg(kg_file)
    assert not marker.exists() and "cannot be read" in caplog.text
    assert again.triples() == kg.triples() and cached.read_bytes()[:6] == b"ARROW1"


def test_a_killed_writers_folder_is_removed_by_the_next_writer(cache, tmp_path):
    path = _write(tmp_path / "train.jsonl")
    folder = store_folder(path, None, "raise", None)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = folder.with_name(f".{folder.name}.{socket.gethostname()}.{int(dead.stdout)}.tmp")  # its writer is gone
    other_host = folder.with_name(f".{folder.name}.elsewhere.{os.getpid()}.tmp")  # may still be writing
    for o in (orphan, other_host):
        o.mkdir(parents=True)
        (o / "records.arrow").write_bytes(b"\0" * 4096)
        quiet = time.time() - 900  # nothing written for 15 minutes (a live writer in a container sharing the host
        os.utime(o / "records.arrow", (quiet, quiet))  # name would still be writing)
        os.utime(o, (quiet, quiet))
    fresh = folder.with_name(f".{folder.name}.{socket.gethostname()}.{int(dead.stdout)}1.tmp")
    fresh.mkdir()  # a pid that looks gone, but written to just now: not removed yet
    read_records(path)  # the next writer
    assert not orphan.exists() and other_host.exists() and fresh.exists() and _stores(cache) == [folder]
    os.utime(other_host, (0, 0))  # a day old, but no marker: it may be anyone's folder of that name
    assert remove_abandoned(folder, "a record store writer") == 0 and other_host.exists()
    mark_folder(other_host)  # a writer's folder (it holds kglightning's marker), a day old: gone wherever it ran
    os.utime(other_host, (0, 0))
    assert remove_abandoned(folder, "a record store writer") == 1 and not other_host.exists()


def test_one_file_has_one_store_however_it_is_touched_or_named(cache, tmp_path):
    path = _write(tmp_path / "train.jsonl")
    read_records(path)
    os.utime(path, ns=(10**18, 10**18))  # touched: a new modification time, the same content
    read_records(path)
    read_records(path, split="train")  # a split means nothing for a .jsonl
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(path.read_bytes())
    again = read_records(copy)
    assert len(_stores(cache)) == 1 and again.source == str(copy)
    path.write_text(path.read_text().replace("question 1?", "question one?"), encoding="utf-8")
    assert read_records(path)[1].question == "question one?" and len(_stores(cache)) == 2  # new content: new store


def test_the_store_key_follows_the_validation_version(cache, tmp_path, monkeypatch):
    path = _write(tmp_path / "train.jsonl")
    before = store_folder(path, None, "raise", None)
    read_records(path)
    monkeypatch.setattr(record_store, "VALIDATION_VERSION", record_store.VALIDATION_VERSION + 1)
    after = store_folder(path, None, "raise", None)
    assert after != before and not after.exists()
    read_records(path)
    assert after.exists()


def test_a_batch_of_only_empty_graphs_loads(cache, tmp_path, monkeypatch):
    """1,025 records whose last (a record batch of its own) has an empty graph, and a file with no graph at all."""
    calls = []
    real = record_store.save_store
    monkeypatch.setattr("kglightning.data.sources.loaders.save_store", lambda *a: calls.append(1) or real(*a))
    path = _write(tmp_path / "train.jsonl", questions=1025, triples=1)
    lines = path.read_text().splitlines()
    last = json.loads(lines[-1])
    lines[-1] = json.dumps({**last, "graph": []})
    path.write_text("\n".join(lines) + "\n")
    empty = _write(tmp_path / "empty.jsonl", questions=3, triples=0)
    for p, n in ((path, 1025), (empty, 3)):
        first = read_records(p)
        for _ in range(2):
            again = read_records(p)
            assert len(again) == n and list(again) == list(first)
    assert len(calls) == 2  # each file stored once, then loaded


def test_a_loaded_vocabulary_stays_in_the_map_and_the_detector_path_does_not_unpack_it(cache, tmp_path):
    from kglightning.datamodules.detection_graphs import DetectionStats, build_detection_graph

    path = _write(tmp_path / "train.jsonl", questions=4, triples=50)
    read_records(path)
    records = read_records(path)
    vocab = records.vocab
    data = vocab.strings.array.buffers()[2]
    maps = [ln.split() for ln in Path("/proc/self/maps").read_text().splitlines() if ln.endswith("vocab.arrow")]
    if not maps:
        pytest.skip("no /proc/self/maps here")
    spans = [tuple(int(x, 16) for x in m[0].split("-")) for m in maps]
    assert any(lo <= data.address < hi for lo, hi in spans)  # the strings are the file's pages, not a copy
    texts = {t for r in records for t in (r.question, *(n for tr in r.graph for n in tr))}

    class Rows(dict):
        def __missing__(self, key):
            self[key] = len(self)
            return self[key]

    rows = Rows({t: i for i, t in enumerate(sorted(texts))})
    for r in records:
        r.prediction = [r.graph[0][2], "Nowhere"]
        assert build_detection_graph(r, rows, DetectionStats(), True, "keep") is not None
    assert not vocab.has_table  # answers were found among each graph's names, not through a map of every name


def test_a_folder_left_half_removed_at_a_stores_place_is_replaced(cache, tmp_path):
    path = _write(tmp_path / "train.jsonl")
    folder = store_folder(path, None, "raise", None)
    folder.mkdir(parents=True)
    (folder / "records.arrow").write_bytes(b"half")  # meta.json went first, then the removal was killed
    read_records(path)
    assert (folder / "meta.json").is_file() and len(read_records(path)) == 6


def test_a_stored_file_has_the_split_it_is_read_as(cache, tmp_path):
    path = _write(tmp_path / "train.jsonl")
    assert read_records(path, split="train").split == "train"
    assert read_records(path, split="test").split == "test" and read_records(path).split is None


def test_values_json_would_change_are_not_stored(cache, tmp_path, monkeypatch, caplog):
    from kglightning.data.records import KGQARecord
    from kglightning.data.sources import loaders

    real = KGQARecord.from_dict

    def with_a_map(data, **kw):  # a parquet map column: tuples, which JSON would give back as lists
        rec = real(data, **kw)
        rec.extra["attrs"] = [("k", 1)]
        return rec

    monkeypatch.setattr(loaders.KGQARecord, "from_dict", staticmethod(with_a_map))
    path = _write(tmp_path / "train.jsonl")
    with caplog.at_level(logging.WARNING):
        first = read_records(path)
    assert "a tuple" in caplog.text and not (store_folder(path, None, "raise", None) / "meta.json").exists()
    assert read_records(path)[0].extra == {"attrs": [("k", 1)]} == first[0].extra


def test_a_dataset_folder_changed_in_place_is_read_again(cache, tmp_path, monkeypatch):
    """Finding 7: a data file changed with its modification time set back (``touch -r``, ``cp -p``) is another
    store, and is read from the file, not from the datasets cache."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    folder = tmp_path / "ds"
    folder.mkdir()
    data = _write(folder / "train.jsonl")
    first = read_records(folder, split="train")
    assert first[0].answer == ["e0"] and first.store is not None
    st = data.stat()
    data.write_text(data.read_text().replace('"e0"', '"x0"'), encoding="utf-8")  # the same length
    os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = read_records(folder, split="train")
    assert again[0].answer == ["x0"] and again.store != first.store
    assert read_records(folder, split="train").store == again.store  # and stored: read once


@pytest.mark.parametrize("name", ["records.arrow", "vocab.arrow"])
def test_a_store_cut_short_is_set_aside_and_written_again(cache, tmp_path, caplog, name):
    """Finding 8: pyarrow tells a stream cut short as an OSError without errno: damage, not the system's."""
    path = _write(tmp_path / "train.jsonl", questions=40)
    read_records(path)
    folder = store_folder(path, None, "raise", None)
    raw = (folder / name).read_bytes()
    (folder / name).write_bytes(raw[: len(raw) // 2])
    with caplog.at_level(logging.WARNING):
        again = read_records(path)
    assert len(again) == 40 and again.store == folder and "cannot be read as a record store" in caplog.text
    assert list(folder.parent.glob(f"{folder.name}.unreadable-*")) and (folder / name).read_bytes() == raw


def test_a_store_of_a_release_before_markers_is_marked_when_read_and_then_cleaned(cache, tmp_path, capsys):
    """Finding 8 of the second review: a store written before markers existed was read on every run but never
    marked, so `clean` could never remove it. A read that checks it whole and trusted marks it."""
    from kglightning.data.store.cache_admin import main
    from kglightning.data.store.cache_marks import is_marked

    data = _write(tmp_path / "q.jsonl")
    read_records(data)
    (store,) = _stores(cache)
    (store / ".kglightning-entry").unlink()  # as a release before markers wrote it
    main(["list"])
    assert "(unmarked" in capsys.readouterr().out
    assert len(read_records(data)) == 6 and read_records(data).store == store
    assert is_marked(store)
    main(["clean", "--older-than", "0"])
    assert f"removed {store}" in capsys.readouterr().out and not store.exists()


def test_a_store_that_fails_its_check_is_never_marked(cache, tmp_path):
    from kglightning.data.store.cache_marks import why_unmarked

    data = _write(tmp_path / "q.jsonl")
    read_records(data)
    (store,) = _stores(cache)
    (store / ".kglightning-entry").unlink()
    os.chmod(store / "records.arrow", 0o666)  # anyone could have rewritten it: not trusted, never adopted
    read_records(data)
    (aside,) = (cache / "records").glob(f"{store.name}.unreadable-*")
    assert why_unmarked(aside) == "" and why_unmarked(store) is None  # set aside unmarked; the new store marked


@pytest.mark.parametrize("first", [".json", ".jsonl"])
def test_the_same_bytes_read_as_json_and_as_jsonl_never_share_a_store(cache, tmp_path, first):
    """Third cache review: one line holding a JSON list of two records is two records as ``.json`` and a bad record
    as ``.jsonl``; the store key left the format out, so the second read returned the first one's records."""
    rec = {"id": "q", "question": "capital of France?", "answer": ["Paris"], "q_entity": ["France"],
           "a_entity": ["Paris"], "graph": [["France", "capital", "Paris"]]}  # fmt: skip
    line = json.dumps([{**rec, "id": "q1"}, {**rec, "id": "q2"}]) + "\n"
    for suffix in (".json", ".jsonl"):
        (tmp_path / f"a{suffix}").write_text(line, encoding="utf-8")
    second = ".jsonl" if first == ".json" else ".json"
    for suffix in (first, second):
        if suffix == ".json":
            assert [r.id for r in read_records(tmp_path / "a.json", on_bad_record="skip")] == ["q1", "q2"]
        else:
            assert len(read_records(tmp_path / "a.jsonl", on_bad_record="skip")) == 0
    with pytest.raises(RecordError, match="a.jsonl:1: expected a JSON object"):
        read_records(tmp_path / "a.jsonl")
