"""The record store: a large file read once, its validated records loaded from binary form with memory-mapped graphs."""

from __future__ import annotations

import json
import logging
import os
import pickle
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kglightning.data.kg import KGIndex
from kglightning.data.sources.loaders import read_records
from kglightning.data.store import record_lock, record_store
from kglightning.data.store.record_store import store_folder


def _row(i: int, **kw) -> dict:
    graph = [[f"e{i}", "r", f"e{i + 1}"], [f"e{i + 1}", "s", "hub"], ["hub", "r", f"é{i}"]]
    return {"id": f"q{i}", "question": f"question {i}?", "answer": [f"e{i + 1}"], "q_entity": [f"e{i}"],
            "a_entity": [f"e{i + 1}"], "graph": graph, **kw}  # fmt: skip


@pytest.fixture
def store_env(tmp_path, monkeypatch):
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    monkeypatch.setattr(record_store, "MAP_FROM_BYTES", 0)  # mapped as a large store is
    path = tmp_path / "train.jsonl"
    rows = [_row(i) for i in range(6)]
    rows[2] = _row(2, prediction=["e3", "e3"], confidence=[0.7, 0.7], prediction_paths=[[["e2", "r", "e3"]], []],
                   note={"k": [1, 2]})  # fmt: skip
    rows[3] = _row(3, graph=[])  # an empty graph (counted)
    rows[4] = _row(4, q_entity=["Atlantis"])  # a topic entity missing from its graph (counted)
    lines = [json.dumps(r, ensure_ascii=False) for r in rows]
    lines.insert(5, json.dumps({"id": "bad", "question": "?"}))  # skipped with on_bad_record="skip"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def parses(monkeypatch) -> list:
    """One entry per parse of a file (a read that did not come from a store)."""
    from kglightning.data.sources import loaders

    real, calls = loaders._read, []

    def counted(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(loaders, "_read", counted)
    return calls


def _parsed(path, monkeypatch, **kw):
    """The records as the file holds them, parsed without the store (what every store read must give back)."""
    with monkeypatch.context() as m:
        m.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "off")
        return read_records(path, **kw)


def _mapped(records) -> bool:
    def base(a):
        while a is not None and not isinstance(a, np.memmap):
            a = a.base
        return a

    return all(base(r.graph.ids) is not None for r in records if len(r.graph))


def test_a_second_read_loads_the_store_with_mapped_graphs(store_env, parses, monkeypatch):
    first = _parsed(store_env, monkeypatch, on_bad_record="skip")
    stored = read_records(store_env, on_bad_record="skip")  # parses, stores, and gives the records as stored
    folder = store_folder(store_env, None, "skip", None)
    assert folder is not None and (folder / "meta.json").is_file() and not _mapped(first) and _mapped(stored)
    again = read_records(store_env, on_bad_record="skip")
    assert len(parses) == 2 and _mapped(again) and list(again) == list(first) == list(stored)  # 2: first and stored
    assert [str(e) for e in stored.skipped] == [str(e) for e in first.skipped]
    assert (stored.empty_graph, stored.unknown_topic) == (first.empty_graph, first.unknown_topic)
    assert [r.graph.tolist() for r in again] == [r.graph.tolist() for r in first]
    assert again[2].extra == {"note": {"k": [1, 2]}} and again[2].confidence == [0.7, 0.7]
    assert again[2].prediction_paths == [[["e2", "r", "e3"]], []] and again[0].prediction_paths is None
    assert (again.source, again.split, again.empty_graph, again.unknown_topic) == (
        first.source, first.split, ["q3"], ["q4"]
    )  # fmt: skip
    assert [str(e) for e in again.skipped] == [str(e) for e in first.skipped] and len(again.skipped) == 1
    assert again.vocab.strings == first.vocab.strings
    for a, b in zip(again, first):
        assert KGIndex.from_record(a).entities == KGIndex.from_record(b).entities
        assert [x.tolist() for x in KGIndex.from_record(a).edge_ids()] == [
            x.tolist() for x in KGIndex.from_record(b).edge_ids()
        ]
    clone = pickle.loads(pickle.dumps(again[0]))  # a DataLoader worker's copy
    assert clone == first[0] and not _mapped([clone])


def test_records_name_their_store_and_arrow_readers_open_it(store_env, monkeypatch):
    import datasets
    import pyarrow as pa

    assert _parsed(store_env, monkeypatch, on_bad_record="skip").store is None  # not from a store
    records = read_records(store_env, on_bad_record="skip")
    assert records.store == store_folder(store_env, None, "skip", None)
    table = datasets.Dataset.from_file(str(records.store / "records.arrow"))
    vocab = pa.ipc.open_stream(pa.memory_map(str(records.store / "vocab.arrow"))).read_all().column("string")
    assert table["id"] == [r.id for r in records] and table[2]["extra"] == '{"note": {"k": [1, 2]}}'
    for row, r in zip(table, records):
        assert [vocab.take(pa.array(t)).to_pylist() for t in row["graph"]] == [list(t) for t in r.graph]


def test_other_arguments_and_a_changed_file_are_other_stores(store_env):
    read_records(store_env, on_bad_record="skip")
    assert len(read_records(store_env, on_bad_record="skip", limit=2)) == 2
    assert store_folder(store_env, None, "skip", 2) != store_folder(store_env, None, "skip", None)
    with pytest.raises(Exception, match=r"train.jsonl:6: field .answer. missing"):
        read_records(store_env)  # "raise" is not served by the "skip" store
    store_env.write_text(store_env.read_text().replace("question 0?", "question zero?"), encoding="utf-8")
    os.utime(store_env, ns=(1, 1))
    assert read_records(store_env, on_bad_record="skip")[0].question == "question zero?"


def test_a_torn_store_is_read_again_and_rewritten(store_env, caplog, parses, monkeypatch):
    first = _parsed(store_env, monkeypatch, on_bad_record="skip")
    read_records(store_env, on_bad_record="skip")
    folder = store_folder(store_env, None, "skip", None)
    torn = folder / "torn"
    torn.write_bytes(b"not an arrow stream")
    os.replace(torn, folder / "records.arrow")
    with caplog.at_level(logging.WARNING):
        again = read_records(store_env, on_bad_record="skip")
    assert "cannot be read" in caplog.text and list(again) == list(first) and len(parses) == 3  # parsed again
    assert list(read_records(store_env, on_bad_record="skip")) == list(first) and len(parses) == 3  # written again


def test_small_files_and_off_are_not_stored(store_env, monkeypatch):
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "1")
    assert store_folder(store_env, None, "raise", None) is None
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "off")
    assert store_folder(store_env, None, "raise", None) is None
    for value in ("inf", "Infinity", "1e400"):  # no file is that large: nothing stored (was an OverflowError)
        monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", value)
        assert store_folder(store_env, None, "raise", None) is None
    for value in ("lots", "nan", "-1"):
        monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", value)
        with pytest.raises(ValueError, match=rf"MIN_MB='{value}': expected a number of MB >= 0, or 'off'"):
            store_folder(store_env, None, "raise", None)
    assert store_folder("hf:rmanluo/RoG-webqsp", "test", "raise", None) is None


def test_values_json_cannot_hold_come_back_as_read_and_are_not_stored(store_env, monkeypatch, caplog):
    import datetime

    from kglightning.data.records import KGQARecord
    from kglightning.data.sources import loaders

    stamp = datetime.datetime(2024, 1, 1)
    real = KGQARecord.from_dict

    def with_extras(data, **kw):  # what a parquet file's timestamp and map columns give
        rec = real(data, **kw)
        rec.extra.update(created=stamp, meta=[("k", 1)])
        return rec

    monkeypatch.setattr(loaders.KGQARecord, "from_dict", staticmethod(with_extras))
    with caplog.at_level(logging.WARNING):
        first = read_records(store_env, on_bad_record="skip")
    assert "field 'extra' holds a value JSON cannot keep" in caplog.text  # the store keeps no pickle
    assert not (store_folder(store_env, None, "skip", None) / "meta.json").exists()
    again = read_records(store_env, on_bad_record="skip")
    assert (
        not _mapped(again) and again[0].extra == {"created": stamp, "meta": [("k", 1)]} and list(again) == list(first)
    )


def test_a_store_that_cannot_be_loaded_now_is_kept(store_env, monkeypatch, caplog):
    read_records(store_env, on_bad_record="skip")
    folder = store_folder(store_env, None, "skip", None)
    real = np.memmap

    def no_memory(*args, **kw):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(np, "memmap", no_memory)
    with caplog.at_level(logging.WARNING):
        assert len(read_records(store_env, on_bad_record="skip")) == 6
    assert "cannot be loaded now" in caplog.text and (folder / "meta.json").is_file()  # kept for the next run
    monkeypatch.setattr(np, "memmap", real)
    assert _mapped(read_records(store_env, on_bad_record="skip"))


def test_a_same_size_edit_that_keeps_the_modification_time_is_seen(store_env):
    read_records(store_env, on_bad_record="skip")
    st = store_env.stat()
    store_env.write_text(store_env.read_text().replace("question 1?", "question 9?"), encoding="utf-8")
    os.utime(store_env, ns=(st.st_atime_ns, st.st_mtime_ns))  # as cp -p or rsync -t leave it
    assert read_records(store_env, on_bad_record="skip")[1].question == "question 9?"


def test_concurrent_first_reads_parse_the_file_once(store_env, monkeypatch, caplog):
    """Two readers of a new large file at once (DDP ranks): one parses it and writes the store, the other waits on
    the store's lock and loads what the first wrote."""
    from kglightning.data.sources import loaders

    parses, waiting = [], threading.Event()
    real = loaders._read

    def slow_read(*args, **kwargs):
        parses.append(threading.current_thread().name)
        waiting.wait(timeout=30)  # hold the lock until the other reader is seen waiting for it
        return real(*args, **kwargs)

    class Seen(logging.Handler):
        def emit(self, record):
            if "waiting for it" in record.getMessage():
                waiting.set()

    monkeypatch.setattr(loaders, "_read", slow_read)
    store_log = logging.getLogger("kglightning.data.store.record_lock")
    caplog.set_level(logging.INFO, logger=store_log.name)
    seen = Seen()
    store_log.addHandler(seen)
    out: dict = {}
    try:
        threads = [
            threading.Thread(target=lambda k=k: out.__setitem__(k, read_records(store_env, on_bad_record="skip")))
            for k in ("rank0", "rank1")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    finally:
        store_log.removeHandler(seen)
    assert waiting.is_set() and len(parses) == 1
    assert list(out["rank0"]) == list(out["rank1"]) and len(out["rank0"]) == 6
    loaded = [k for k in out if _mapped(out[k])]
    assert loaded and parses[0] not in loaded  # the waiting reader loaded the store the parsing one wrote


def _read_in_process(path, start, results) -> None:
    start.wait(timeout=60)
    records = read_records(path, on_bad_record="skip")
    results.put((os.getpid(), [r.id for r in records], _mapped(records)))


@pytest.mark.skipif(sys.platform != "linux", reason="forks")
def test_processes_reading_a_new_file_at_once_parse_it_once(store_env, monkeypatch, tmp_path):
    """Three processes (DDP ranks on one node), not threads: the file lock is a real lock between processes."""
    import multiprocessing as mp

    from kglightning.data.sources import loaders

    real, marks = loaders._read, tmp_path / "parses"

    def slow_read(*args, **kwargs):
        with open(marks, "a") as f:  # appended by whichever process parses
            f.write(f"{os.getpid()}\n")
        time.sleep(1.0)  # long enough for the others to find the lock taken
        return real(*args, **kwargs)

    monkeypatch.setattr(loaders, "_read", slow_read)  # the forked children inherit it
    ctx = mp.get_context("fork")
    start, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_read_in_process, args=(store_env, start, results)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(p.exitcode == 0 for p in procs)
    parsers = marks.read_text().split()
    assert len(parsers) == 1  # one process parsed the file
    assert all(ids == got[0][1] for _, ids, _ in got) and len(got[0][1]) == 6
    assert all(mapped for _, _, mapped in got)  # the parser too gives the records as its store holds them


def _lock_of(store_env):
    from filelock import FileLock

    folder = store_folder(store_env, None, "skip", None)
    folder.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(folder.with_name(folder.name + ".lock")))


def test_an_existing_store_is_loaded_without_waiting_for_the_lock(store_env, monkeypatch):
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_WAIT_S", "30")
    first = read_records(store_env, on_bad_record="skip")
    lock = _lock_of(store_env)
    box: dict = {}
    with lock:  # another process holds it (say, reading a changed file into a new store of the same key)
        reader = threading.Thread(target=lambda: box.setdefault("r", read_records(store_env, on_bad_record="skip")))
        reader.start()
        reader.join(timeout=10)
        assert not reader.is_alive() and _mapped(box["r"]) and list(box["r"]) == list(first)


def test_when_the_lock_holder_writes_no_store_the_waiting_reader_parses_the_file(store_env, caplog, parses):
    lock = _lock_of(store_env)
    box: dict = {}
    caplog.set_level(logging.INFO, logger="kglightning.data.store.record_lock")
    lock.acquire()  # a process that will fail to write its store (a full disk)
    reader = threading.Thread(target=lambda: box.setdefault("r", read_records(store_env, on_bad_record="skip")))
    reader.start()
    for _ in range(200):
        if "waiting for it" in caplog.text:
            break
        reader.join(timeout=0.05)
    assert "waiting for it" in caplog.text and reader.is_alive()
    lock.release()  # gone, no store written
    reader.join(timeout=30)
    assert not reader.is_alive() and len(box["r"]) == 6 and len(parses) == 1  # parsed, not loaded
    assert (store_folder(store_env, None, "skip", None) / "meta.json").is_file()  # and stored for the next read


def test_the_wait_for_the_lock_is_bounded_and_a_lock_that_cannot_be_taken_is_skipped(store_env, monkeypatch, caplog):
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_WAIT_S", "0.3")
    lock = _lock_of(store_env)
    with lock:  # held by a process that hangs (stopped, or on another node)
        records = read_records(store_env, on_bad_record="skip")  # this thread: a second handle on the file
    assert len(records) == 6 and "reading" in caplog.text and "without it" in caplog.text
    shutil.rmtree(store_folder(store_env, None, "skip", None))
    caplog.clear()

    def no_locks(self, *args, **kwargs):
        raise NotImplementedError("FileSystem does not appear to support flock")  # filelock 3.x on such a mount

    monkeypatch.setattr("filelock.BaseFileLock.acquire", no_locks)
    assert len(read_records(store_env, on_bad_record="skip")) == 6
    assert "no lock for the record store" in caplog.text


@pytest.mark.parametrize("value", ["soon", "nan"])
def test_a_bad_wait_setting_is_refused(store_env, monkeypatch, value):
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_WAIT_S", value)
    with pytest.raises(ValueError, match="KGLIGHTNING_RECORD_STORE_WAIT_S"):
        read_records(store_env, on_bad_record="skip")


def test_a_wait_of_zero_takes_no_lock(store_env, monkeypatch, caplog):
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_WAIT_S", "0")
    with _lock_of(store_env):  # held elsewhere: not waited for, not even tried
        assert len(read_records(store_env, on_bad_record="skip")) == 6
    assert "lock" not in caplog.text


def test_a_dataset_folder_is_stored_by_its_fingerprint(tmp_path, monkeypatch, parses):
    """A split of a ``datasets`` folder (as a hub dataset is read) is validated once, then loaded from the store;
    other data saved at the same place has another fingerprint, so another store."""
    import datasets

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    monkeypatch.setattr(record_store, "MAP_FROM_BYTES", 0)
    folder = tmp_path / "rog"
    rows = [_row(i) for i in range(4)]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:3]), "test": datasets.Dataset.from_list(rows[3:])}
                         ).save_to_disk(str(folder))  # fmt: skip
    first = read_records(folder, split="train")
    again = read_records(folder, split="train")
    assert len(parses) == 1 and _mapped(again) and list(again) == list(first) and again.split == "train"
    assert [r.id for r in read_records(folder, split="test")] == ["q3"]
    shutil.rmtree(folder)
    datasets.DatasetDict({"train": datasets.Dataset.from_list([_row(7)])}).save_to_disk(str(folder))
    assert [r.id for r in read_records(folder, split="train")] == ["q7"]


def test_the_records_of_many_small_files_hold_no_file_descriptors(tmp_path, monkeypatch):
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    fds = Path("/proc/self/fd")
    if not fds.is_dir():
        pytest.skip("no /proc/self/fd to count descriptors on this system")
    paths = []
    for i in range(40):
        paths.append(tmp_path / f"part{i}.jsonl")
        paths[-1].write_text(json.dumps(_row(i)) + "\n", encoding="utf-8")
    kept = [read_records(p) for p in paths]  # first reads: parsed, stored, loaded back
    before = len(list(fds.iterdir()))
    kept += [read_records(p) for p in paths]  # later reads: from the stores
    assert len(list(fds.iterdir())) - before < 5 and all(len(r) == 1 for r in kept)
    assert all(not _mapped(r) for r in kept) and kept[40][0].graph.tolist() == kept[0][0].graph.tolist()


def test_a_cache_that_cannot_be_written_warns_once_not_at_every_read(store_env, monkeypatch, caplog):
    def read_only(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(record_store, "private_dir", read_only)  # what a read-only cache gives every writer
    monkeypatch.setattr(record_lock, "private_dir", read_only)
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            assert len(read_records(store_env, on_bad_record="skip")) == 6
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum("no lock for the record store" in m for m in warned) == 1
    assert sum("could not keep the records" in m for m in warned) == 1
    later = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert sum("could not keep the records" in m for m in later) == 2  # still said, at DEBUG


def test_a_read_only_cache_warns_once_for_all_its_files(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))

    def read_only(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(record_store, "private_dir", read_only)
    monkeypatch.setattr(record_lock, "private_dir", read_only)
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"part{i}.jsonl")
        paths[-1].write_text(json.dumps(_row(i)) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert all(len(read_records(p)) == 1 for p in paths)
    assert len(caplog.records) == 2  # "no lock" and "could not keep", once each for the cache, not once per file
