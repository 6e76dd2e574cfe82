"""kglightning cache list|du|clean: entries, sizes, what killed runs left, age and size limits."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kglightning.cli import main
from kglightning.data.store.cache_admin import clean, entries


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    r = tmp_path / "cache"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(r))
    now = time.time()
    for kind, name, size, age_days in (
        ("records", "aaaa", 3000, 40), ("records", "bbbb", 2000, 1), ("kg", "kg-x.pkl", 500, 10),
        ("embeddings", "shard0", 1000, 0),
    ):  # fmt: skip
        p = r / kind / name
        if name.endswith(".pkl"):
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(b"\0" * size)
        else:
            p.mkdir(parents=True)
            (p / ("meta.json" if kind == "records" else "data")).write_bytes(b"\0" * size)  # a store has its meta
        os.utime(p, (now - age_days * 86400, now - age_days * 86400))
    return r


def test_entries_are_listed_oldest_first_with_their_sizes(root):
    got = [(e.kind, e.path.name, e.bytes) for e in entries(root)]
    assert got == [("records", "aaaa", 3000), ("kg", "kg-x.pkl", 500), ("records", "bbbb", 2000),
                   ("embeddings", "shard0", 1000)]  # fmt: skip
    assert [e.path.name for e in entries(root, ["kg"])] == ["kg-x.pkl"]


def test_clean_by_age_and_by_size_least_recently_used_first(root):
    assert [e.path.name for e in clean(root, older_than_s=30 * 86400, dry_run=True)] == ["aaaa"]
    assert (root / "records/aaaa").exists()  # a dry run removes nothing
    gone = clean(root, max_bytes=3000)  # 6500 bytes: the oldest go until 3000 or less are left
    assert [e.path.name for e in gone] == ["aaaa", "kg-x.pkl"]
    assert not (root / "records/aaaa").exists() and (root / "records/bbbb").exists()
    assert clean(root, max_bytes=0, kinds=["records"], keep=root / "records/bbbb") == []


def test_clean_removes_what_killed_writers_left(root):
    recs = root / "records"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = recs / f".bbbb.{socket.gethostname()}.{int(dead.stdout)}.tmp"
    running = recs / f".cccc.{socket.gethostname()}.{os.getpid()}.tmp"
    old_lock, fresh_lock, held_lock = recs / "dddd.lock", recs / "eeee.lock", recs / "bbbb.lock"
    for p in (orphan, running):
        p.mkdir()
        os.utime(p, (time.time() - 900, time.time() - 900))  # nothing written for 15 minutes
    torn = recs / "ffff"  # a store whose removal was killed: no meta.json
    torn.mkdir()
    (torn / "records.arrow").write_bytes(b"\0")
    os.utime(torn, (time.time() - 7200, time.time() - 7200))
    (recs / "stamps").mkdir()
    (recs / "stamps/old").write_text("0" * 32)
    (recs / "stamps/new").write_text("0" * 32)
    os.utime(recs / "stamps/old", (0, 0))
    for p in (old_lock, fresh_lock, held_lock):
        p.write_text("")
    os.utime(old_lock, (0, 0))
    os.utime(held_lock, (0, 0))
    from filelock import FileLock

    held = FileLock(str(recs / "gggg.lock"))  # held by a reader still parsing: no store yet, and kept
    held.acquire()
    os.utime(recs / "gggg.lock", (0, 0))
    try:
        clean(root)
    finally:
        held.release()
    assert (recs / "gggg.lock").exists() and not torn.exists()
    assert not (recs / "stamps/old").exists() and (recs / "stamps/new").exists()
    assert "stamps" not in [e.path.name for e in entries(root)]
    assert not orphan.exists() and running.exists()  # this process is alive
    assert not old_lock.exists() and fresh_lock.exists() and held_lock.exists()  # bbbb's store is there
    assert all(not e.path.name.startswith(".") and not e.path.name.endswith(".lock") for e in entries(root))


def test_the_cache_command(root, capsys):
    assert main(["cache", "du"]) == 0
    out = capsys.readouterr().out
    assert "records" in out and "4.9 KiB" in out and "total" in out  # 5000 bytes of records
    assert main(["cache", "list", "--kind", "kg"]) == 0
    assert "kg-x.pkl" in capsys.readouterr().out
    assert main(["cache", "clean", "--older-than", "5", "--dry-run"]) == 0
    assert "would remove 2 entries" in capsys.readouterr().out and (root / "kg/kg-x.pkl").exists()
    assert main(["cache", "clean", "--older-than", "5"]) == 0
    assert not (root / "kg/kg-x.pkl").exists() and (root / "records/bbbb").exists()
    assert main(["cache", "clean", "--max-size", "-1"]) == 2


def _age_tree(path, seconds):
    """Set the modification times of ``path`` and everything in it ``seconds`` back."""
    past = time.time() - seconds
    for p in [path, *path.rglob("*")]:
        os.utime(p, (past, past), follow_symlinks=False)


def test_a_size_cap_evicts_older_record_stores_when_one_is_written(tmp_path, monkeypatch):
    from kglightning.data.sources.loaders import read_records
    from kglightning.data.store.record_store import store_folder

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    monkeypatch.setenv("KGLIGHTNING_CACHE_MAX_GB", str(1 / 2**30))  # one byte: only the newest store stays
    _cap_every_write(monkeypatch)
    paths = []
    for i in range(2):
        p = tmp_path / f"s{i}.jsonl"
        p.write_text(json.dumps({"id": f"q{i}", "question": "?", "answer": [], "q_entity": ["a"], "a_entity": [],
                                 "graph": [["a", "r", f"b{i}"]]}) + "\n")  # fmt: skip
        read_records(p)
        paths.append(p)
        _age_tree(store_folder(p, None, "raise", None), 3600)  # written an hour ago: no job is writing it
    first, second = (store_folder(p, None, "raise", None) for p in paths)
    assert not first.exists() and (second / "meta.json").is_file()


def test_the_size_cap_covers_every_kind_and_spares_entries_written_in_the_last_ten_minutes(tmp_path, monkeypatch,
                                                                                         caplog):  # fmt: skip
    import logging

    from kglightning.data.store import cache_admin
    from kglightning.data.store.cache_admin import enforce_cap

    root = tmp_path / "cache"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(root))
    _cap_every_write(monkeypatch)
    old_kg, old_emb, busy, written = (root / "kg/index-a.arrow", root / "embeddings/enc/shard-1.arrow",
                                      root / "pcst-cuts/fp/tmpabc", root / "records/new/meta.json")  # fmt: skip
    for f, n in ((old_kg, 3000), (old_emb, 4000), (busy, 5000), (written, 1000)):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x" * n)
    _age_tree(old_kg, 7200), _age_tree(old_emb.parent, 3600)
    busy_entry = busy.parent
    past = time.time() - 7200
    os.utime(busy_entry, (past, past))  # the folder looks old; a file in it was written a moment ago
    monkeypatch.delenv("KGLIGHTNING_CACHE_MAX_GB", raising=False)
    assert enforce_cap(written) == [] and old_kg.exists()  # no cap set: nothing to do
    monkeypatch.setenv("KGLIGHTNING_CACHE_MAX_GB", str(5500 / 2**30))
    with caplog.at_level(logging.WARNING):
        gone = enforce_cap(written)
        assert enforce_cap(written) == []
        assert caplog.text.count("over KGLIGHTNING_CACHE_MAX_GB") == 1
        monkeypatch.setattr(cache_admin, "CAP_EVERY_S", 3600.0)
        monkeypatch.setattr(cache_admin, "_last_cap", {})
        enforce_cap(written)
        old_kg.write_bytes(b"x" * 3000)
        _age_tree(old_kg, 7200)
        assert enforce_cap(written) == [] and old_kg.exists()  # walked once an hour here: not at this write
    assert {e.path for e in gone} == {old_kg, old_emb.parent}  # least recently used first, of any kind
    assert busy.exists() and written.exists()  # the entry written now, and one being written, are spared
    assert enforce_cap(tmp_path / "elsewhere.arrow") == []  # a path outside the cache


def _cap_every_write(monkeypatch):
    from kglightning.data.store import cache, cache_admin

    monkeypatch.setattr(cache_admin, "CAP_EVERY_S", 0.0)
    monkeypatch.setattr(cache_admin, "_last_cap", {})
    monkeypatch.setattr(cache, "_warned", set())


def test_the_size_cap_leaves_the_benchmark_other_tools_folders_and_pinned_entries(tmp_path, monkeypatch):
    from kglightning.data.store.cache_admin import enforce_cap
    from kglightning.data.store.cache_pins import pin, unpin

    root = tmp_path / "cache"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(root))
    monkeypatch.setenv("KGLIGHTNING_CACHE_MAX_GB", "0")
    _cap_every_write(monkeypatch)
    kept = [root / "embedded-v1-seed0/validation.jsonl", root / "huggingface/hub/model.bin",
            root / "embeddings/enc/shard-1.arrow", root / "pcst-cuts/fp/piece-0.arrow"]  # fmt: skip
    for f in [*kept, root / "kg/index-a.arrow"]:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x" * 100)
    _age_tree(root, 7200)
    in_use = pin(kept[2])  # this process's embedding cache: a pin held until it is released
    other = subprocess.Popen([sys.executable, "-c", "import sys, time; from kglightning.data.store.cache_pins import "
                              f"pin; pin({str(kept[3])!r}); print('pinned', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert other.stdout.readline().strip() == "pinned"  # another process maps into pcst-cuts/fp
        (root / "records/new").mkdir(parents=True)
        gone = enforce_cap(root / "records/new")
        assert [e.path for e in gone] == [root / "kg/index-a.arrow"] and all(f.exists() for f in kept)
        assert main(["cache", "clean", "--older-than", "0"]) == 0
        assert kept[2].exists() and kept[3].exists()  # clean leaves pinned entries too
    finally:
        other.kill()
        other.wait()
    unpin(in_use)
    assert main(["cache", "clean", "--older-than", "0"]) == 0
    assert not kept[2].exists() and not kept[3].exists()  # released: removable again
    assert kept[1].exists()  # another tool's folder in the cache root: cleaned only when --kind names it


def test_a_bad_or_infinite_cap_never_fails_a_write_and_a_linked_kind_folder_is_capped(tmp_path, monkeypatch, caplog):
    import logging

    from kglightning.data.store.cache_admin import enforce_cap, max_bytes_from_env
    from kglightning.data.store.cache_pins import entry_of

    root = tmp_path / "cache"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(root))
    _cap_every_write(monkeypatch)
    (root / "kg").mkdir(parents=True)
    for value in ("inf", "1e400"):
        monkeypatch.setenv("KGLIGHTNING_CACHE_MAX_GB", value)
        assert max_bytes_from_env() is None and enforce_cap(root / "kg/x.arrow") == []
    monkeypatch.setenv("KGLIGHTNING_CACHE_MAX_GB", "5GB")
    with caplog.at_level(logging.WARNING):
        assert enforce_cap(root / "kg/x.arrow") == [] and enforce_cap(root / "kg/y.arrow") == []
    assert caplog.text.count("KGLIGHTNING_CACHE_MAX_GB='5GB': expected a number of GB") == 1
    with pytest.raises(ValueError, match="'5GB'"):
        max_bytes_from_env()  # `kglightning cache` and callers that ask say it as an error
    elsewhere = tmp_path / "big-disk/embeddings"
    elsewhere.mkdir(parents=True)
    (root / "embeddings").symlink_to(elsewhere)
    assert entry_of(root / "embeddings/enc/shard.arrow") == root / "embeddings/enc"


def test_an_earlier_versions_kind_is_cleaned_and_other_tools_folders_are_named_not_counted(tmp_path, monkeypatch,
                                                                                          capsys):  # fmt: skip
    root = tmp_path / "cache"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(root))
    for f in (root / "proposals/old/rows.jsonl", root / "huggingface/hub/model.bin", root / "kg/index-a.arrow"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x" * 1024)
    assert main(["cache", "du"]) == 0
    out = capsys.readouterr().out
    assert "proposals" in out and re.search(r"total +2.0 KiB", out)  # proposals/ (earlier versions) and kg/
    assert "not kglightning's, not counted (--kind NAME to include): huggingface" in out
    assert main(["cache", "clean", "--older-than", "0"]) == 0
    assert not (root / "proposals/old").exists() and (root / "huggingface/hub/model.bin").exists()
