"""kglightning cache list|du|clean: only what carries kglightning's marker goes, no link is followed, every removed
path is printed, a dry run writes nothing, and no write evicts anything."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kglightning.cli import main
from kglightning.data.store.cache_clean import clean
from kglightning.data.store.cache_marks import mark_file, mark_folder, marker_of
from kglightning.data.store.cache_scan import entries

DAY = 86400


def _age(path: Path, days: float) -> None:
    """Set the modification times of ``path``, everything in it and its marker ``days`` back."""
    past = time.time() - days * DAY
    for p in [path, *(path.rglob("*") if path.is_dir() else ()), marker_of(path)]:
        if os.path.lexists(p):
            os.utime(p, (past, past), follow_symlinks=False)


def _entry(root: Path, rel: str, size: int, days: float, marked: bool = True) -> Path:
    """A cache entry at ``root/rel``: a folder holding ``size`` bytes, or a file when ``rel`` ends in ``.arrow``."""
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.suffix == ".arrow":
        p.write_bytes(b"\0" * size)
        if marked:
            mark_file(p)
    else:
        p.mkdir()
        (p / "data").write_bytes(b"\0" * size)
        if marked:
            mark_folder(p)
    _age(p, days)
    return p


def _tree(root: Path) -> dict[str, tuple[float, int]]:
    """Every path under ``root`` (links not followed) with its modification time and size."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.relpath(os.path.join(dirpath, name), root)] = (st.st_mtime, st.st_size)
    return out


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    r = tmp_path / "cache"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(r))
    monkeypatch.delenv("KGLIGHTNING_CACHE_MAX_GB", raising=False)
    return r


def test_clean_removes_only_marked_entries_and_prints_every_path(root, capsys):
    old_store = _entry(root, "records/aaaa", 3000, 40)
    new_store = _entry(root, "records/bbbb", 2000, 0)
    old_index = _entry(root, "kg/index-x.arrow", 500, 10)
    notes = _entry(root, "records/my_notes", 100, 30, marked=False)  # no meta.json, a month old: the user's
    dump = _entry(root, "kg/my_freebase_dump", 4000, 30, marked=False)
    legacy = _entry(root, "embeddings/enc-w1234", 1000, 30, marked=False)  # an entry of an earlier version
    assert main(["cache", "clean", "--older-than", "5"]) == 0
    out = capsys.readouterr().out
    assert not old_store.exists() and not old_index.exists() and not marker_of(old_index).exists()
    assert new_store.exists() and notes.exists() and dump.exists() and legacy.exists()
    assert f"removed {old_store} (2.9 KiB; unused for 40.0 days)" in out and f"removed {old_index} (" in out
    assert "removed 2 paths, 3.4 KiB" in out and "left 3 unmarked entries" in out
    assert main(["cache", "list"]) == 0
    listed = capsys.readouterr().out
    assert "my_freebase_dump  (unmarked: never removed by clean)" in listed and "remove them by hand" in listed


def test_max_size_counts_and_removes_marked_entries_only(root, capsys, monkeypatch):
    older, newer = _entry(root, "records/aaaa", 3000, 3), _entry(root, "embeddings/enc", 2000, 1)
    dump = _entry(root, "kg/my_freebase_dump", 10_000, 30, marked=False)
    monkeypatch.setenv("KGLIGHTNING_CACHE_MAX_GB", str(2500 / 2**30))  # the default of --max-size only
    assert main(["cache", "clean"]) == 0
    assert not older.exists() and newer.exists() and dump.exists()  # 2000 bytes of marked entries left
    assert f"removed {older} (2.9 KiB; least recently used, over --max-size 2.4 KiB)" in capsys.readouterr().out
    assert main(["cache", "clean", "--max-size", "0"]) == 0
    assert not newer.exists() and dump.exists()


def test_no_write_evicts_anything_whatever_the_cap(root, tmp_path, monkeypatch):
    from kglightning.data.sources.loaders import read_records
    from kglightning.data.store.record_store import store_folder

    monkeypatch.setenv("KGLIGHTNING_CACHE_MAX_GB", "0")
    dump = _entry(root, "kg/my_freebase_dump", 100, 30, marked=False)
    stores = []
    for i in range(2):
        p = tmp_path / f"s{i}.jsonl"
        p.write_text(json.dumps({"id": f"q{i}", "question": "?", "answer": [], "q_entity": ["a"], "a_entity": [],
                                 "graph": [["a", "r", f"b{i}"]]}) + "\n")  # fmt: skip
        read_records(p)
        stores.append(store_folder(p, None, "raise", None))
        _age(stores[-1], 1)
    assert all((s / "meta.json").is_file() and (s / ".kglightning-entry").is_file() for s in stores)
    assert dump.exists()


def test_a_linked_kind_folder_or_entry_is_skipped_and_nothing_outside_the_root_goes(root, tmp_path, capsys):
    outside = tmp_path / "projects"
    mine = _entry(outside, "thesis", 100, 30)  # even one that looks like an entry: the link is not followed
    (outside / "torn").mkdir()
    _age(outside / "torn", 30)
    root.mkdir()
    (root / "records").symlink_to(outside)
    (root / "kg").mkdir()
    (root / "kg" / "index-link").symlink_to(mine)
    for argv in (["--older-than", "0"], ["--max-size", "0"], []):
        assert main(["cache", "clean", *argv]) == 0
        out = capsys.readouterr().out
        assert f"skipped {root / 'records'}: a symbolic link" in out and f"skipped {root / 'kg/index-link'}" in out
    assert mine.exists() and (mine / "data").exists() and (outside / "torn").exists()
    assert (root / "kg" / "index-link").is_symlink()


def test_a_dry_run_lists_what_would_go_and_writes_nothing(root, capsys):
    _entry(root, "records/aaaa", 3000, 40)
    _entry(root, "kg/index-x.arrow", 500, 10)
    dead = _dead_pid()
    tmp = root / "records" / f".cccc.{socket.gethostname()}.{dead}.tmp"
    tmp.mkdir()
    _age(tmp, 1)
    lock = root / "records" / "0123456789abcdef.lock"
    lock.write_text("")
    _age(lock, 2)
    before = _tree(root)
    assert main(["cache", "clean", "--older-than", "0", "--max-size", "0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert _tree(root) == before  # no marker, lock or folder written, nothing removed or touched
    for p in (root / "records/aaaa", root / "kg/index-x.arrow", tmp, lock):
        assert f"would remove {p} (" in out
    assert "would remove 4 paths" in out


def _dead_pid() -> int:
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(out.stdout)


def test_what_killed_runs_left_is_listed_then_cleaned_by_its_exact_names(root, capsys):
    recs = root / "records"
    store = _entry(root, "records/bbbb", 10, 0)
    host, dead = socket.gethostname(), _dead_pid()
    orphan = recs / f".aaaa.{host}.{dead}.tmp"  # a store writer killed part-way
    running = recs / f".cccc.{host}.{os.getpid()}.tmp"  # this process is alive: still writing
    for p in (orphan, running):
        p.mkdir()
        (p / "records.arrow").write_bytes(b"\0" * 41_000)
        _age(p, 900 / DAY)  # nothing written for 15 minutes
    assert {(e.path, e.state) for e in entries(root)} >= {(orphan, "temporary"), (running, "temporary")}
    assert main(["cache", "du"]) == 0
    assert "records (temporary)" in capsys.readouterr().out
    old_lock, held_lock, kept_lock = recs / "dddd0000dddd0000.lock", recs / "eeee0000eeee0000.lock", recs / "bbbb.lock"
    own_lock = recs / "bbbbbbbbbbbbbbbb.lock"
    (recs / "bbbbbbbbbbbbbbbb").mkdir()  # its entry is there
    user_lock = recs / "notes.lock"  # not a name kglightning writes
    for p in (old_lock, held_lock, kept_lock, own_lock, user_lock):
        p.write_text("")
        _age(p, 2)
    (recs / "stamps").mkdir()
    (recs / "stamps" / ("0" * 20)).write_text("0" * 32)
    (recs / "stamps" / ("1" * 20)).write_text("0" * 32)
    (recs / "stamps" / "my-note").write_text("keep")
    _age(recs / "stamps" / ("0" * 20), 40)
    _age(recs / "stamps" / "my-note", 40)
    sidecar = root / "kg" / ".index-gone.arrow.kglightning-entry"  # a KG index writer killed before its rename
    sidecar.parent.mkdir()
    sidecar.write_text("")
    _age(sidecar, 2)
    from filelock import FileLock

    held = FileLock(str(held_lock))  # a reader still parsing: no store yet, and kept
    held.acquire()
    try:
        assert main(["cache", "clean"]) == 0
    finally:
        held.release()
    out = capsys.readouterr().out
    gone = [orphan, old_lock, recs / "stamps" / ("0" * 20), sidecar]
    assert all(not p.exists() and f"removed {p} (" in out for p in gone), out
    kept = [running, held_lock, kept_lock, own_lock, user_lock, recs / "stamps" / ("1" * 20), store,
            recs / "stamps" / "my-note"]  # fmt: skip
    assert all(p.exists() for p in kept) and "removed 4 paths" in out


def test_clean_spares_pinned_entries(root):
    from kglightning.data.store.cache_pins import pin, unpin

    emb, cuts = _entry(root, "embeddings/enc", 100, 3), _entry(root, "pcst-cuts/fp", 100, 3)
    in_use = pin(emb / "data")  # this process's embedding cache
    other = subprocess.Popen([sys.executable, "-c", "import time; from kglightning.data.store.cache_pins import pin; "
                              f"pin({str(cuts)!r}); print('pinned', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert other.stdout.readline().strip() == "pinned"
        done = clean(root, older_than_s=0, max_bytes=0)
        assert emb.exists() and cuts.exists() and done.removed == []
        assert f"{emb}: in use by a running process" in done.skipped
    finally:
        other.kill()
        other.wait()
    unpin(in_use)
    assert {p for p, _, _ in clean(root, older_than_s=0).removed} == {emb, cuts}


def test_reading_an_entry_counts_as_using_it(root, tmp_path):
    import torch

    from kglightning.data.embeddings import EmbeddingCache

    class Toy:
        dim, cache_key = 2, "toy"

        def encode(self, texts):
            return torch.tensor([[len(t), 1.0] for t in texts])

    EmbeddingCache(Toy(), root / "embeddings").add(["Paris", "Berlin"])
    folder = root / "embeddings" / "toy"
    _age(folder, 3)  # written three days ago
    from kglightning.data.store import cache_marks

    cache_marks._touched.clear()  # a new process
    assert EmbeddingCache(Toy(), root / "embeddings").embed(["Paris"]).tolist() == [[5.0, 1.0]]  # read today
    assert clean(root, older_than_s=1 * DAY).removed == [] and folder.exists()
    assert (folder / ".kglightning-entry").stat().st_mtime > time.time() - 60


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--max-size", "nan"], "--max-size='nan': expected a number of GB >= 0"),
        (["--max-size", "-1"], "--max-size='-1': expected a number of GB >= 0"),
        (["--older-than", "nan"], "--older-than nan: expected a number of days >= 0"),
        (["--older-than", "1day"], "--older-than 1day: expected a number of days >= 0"),
    ],
)
def test_numbers_that_are_not_sizes_or_days_are_refused_with_a_message(root, capsys, argv, message):
    assert main(["cache", "clean", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_infinite_size_or_age_removes_nothing_and_a_bad_cap_variable_is_refused(root, capsys, monkeypatch):
    store = _entry(root, "records/aaaa", 3000, 40)
    assert main(["cache", "clean", "--max-size", "inf"]) == 0 and store.exists()
    assert main(["cache", "clean", "--older-than", "inf"]) == 0 and store.exists()
    monkeypatch.setenv("KGLIGHTNING_CACHE_MAX_GB", "nan")
    capsys.readouterr()
    assert main(["cache", "clean"]) == 2 and store.exists()
    assert "KGLIGHTNING_CACHE_MAX_GB='nan': expected a number of GB >= 0" in capsys.readouterr().err


def test_other_tools_folders_and_the_embedded_benchmark(root, capsys):
    hub = root / "huggingface" / "hub" / "model.bin"
    hub.parent.mkdir(parents=True)
    hub.write_bytes(b"x" * 1024)
    _age(root / "huggingface", 30)
    bench = _entry(root, "embedded-v1-seed0", 100, 30)
    old_bench = _entry(root, "embedded-v1-seed1", 100, 30, marked=False)
    proposals = _entry(root, "proposals/old", 100, 30, marked=False)  # an earlier version's kind
    assert main(["cache", "du"]) == 0
    out = capsys.readouterr().out
    assert "not kglightning's, not counted: huggingface" in out and "proposals (unmarked)" in out
    assert main(["cache", "clean", "--older-than", "0"]) == 0
    assert not bench.exists() and old_bench.exists() and proposals.exists() and hub.exists()
    assert main(["cache", "clean", "--older-than", "0", "--kind", "huggingface"]) == 0 and hub.exists()


def test_a_users_files_of_names_like_kglightnings_are_never_removed(root, capsys):
    """Finding 9: only this host's temporaries, by their exact form, and empty bookkeeping files of this user go."""
    host, dead = socket.gethostname(), _dead_pid()
    users = {"records/.backup.2023.tmp": "u", "kg/.notes.1.tmp": "u", "records/stamps/0123456789abcdef0123": "mine",
             "records/0123456789abcdef.lock": "l", "kg/.mydata.kglightning-entry": "m", "kg/.foo.in-use": "m",
             f"kg/.other.elsewhere.{dead}.tmp": "u"}  # fmt: skip
    for rel, text in users.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        _age(root / rel, 30)
    orphan = root / "kg" / f".index-1.arrow.{host}.{dead}.tmp"  # a KG index writer's, killed
    orphan.write_bytes(b"\0" * 10)
    _age(orphan, 30)
    assert main(["cache", "clean", "--older-than", "1", "--max-size", "0"]) == 0
    assert all((root / rel).read_text() == text for rel, text in users.items())
    assert not orphan.exists() and "removed 1 paths" in capsys.readouterr().out


def _deep(top: Path, levels: int) -> Path:
    top.mkdir(parents=True)
    fd = os.open(top, os.O_RDONLY)
    try:
        for _ in range(levels):  # relative to the folder above: no path gets longer than a name
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = sub
        with open(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "wb") as f:
            f.write(b"\0" * 100)
    finally:
        os.close(fd)
    return top


def test_a_deeply_nested_folder_is_listed_and_cleaned_without_recursion(root, capsys):
    """Finding 10: 1200 levels of folders (past Python's recursion limit) are measured, and removed when marked."""
    unmarked = _deep(root / "records" / "my_tree", 1200)
    marked = _deep(root / "kg" / "old_tree", 1200)
    try:
        mark_folder(marked)
        os.utime(marked / ".kglightning-entry", (time.time() - 3 * DAY,) * 2)  # its last use
        assert main(["cache", "list"]) == 0
        out = capsys.readouterr().out
        assert "my_tree  (unmarked" in out and "old_tree" in out
        assert main(["cache", "clean", "--older-than", "1"]) == 0
        assert unmarked.exists() and not marked.exists() and f"removed {marked} (" in capsys.readouterr().out
        assert sorted(p.name for p in (root / "kg").iterdir()) == []
    finally:  # (pytest's own clean-up of old tmp_path folders recurses)
        from kglightning.data.store.owned_files import remove_tree_at

        for tree in (unmarked, marked):
            fd = os.open(tree.parent, os.O_RDONLY)
            with contextlib.suppress(FileNotFoundError):
                remove_tree_at(fd, tree.name)
            os.close(fd)


def test_each_removal_is_printed_as_it_happens(root, capsys, monkeypatch):
    """A clean stopped part-way has printed what it removed."""
    from kglightning.data.store import cache_clean

    first, second = _entry(root, "records/aaaa", 10, 30), _entry(root, "records/bbbb", 10, 20)
    real, calls = cache_clean._remove_entry, []

    def stopped(fd, name):
        calls.append(name)
        if len(calls) == 2:
            raise KeyboardInterrupt  # ^C while removing the second entry
        return real(fd, name)

    monkeypatch.setattr(cache_clean, "_remove_entry", stopped)
    with pytest.raises(KeyboardInterrupt):
        main(["cache", "clean", "--older-than", "1"])
    out = capsys.readouterr().out
    assert f"removed {first} (" in out and not first.exists() and second.exists()


def test_a_cache_root_that_is_a_link_is_used_and_cleaned(tmp_path, monkeypatch, capsys):
    """Links are refused inside the cache; the root itself may be one (``~/.cache`` on another disk)."""
    real = tmp_path / "scratch"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "link"))
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "q?", "answer": ["a"], "q_entity": ["t"], "a_entity": ["a"],
                                "graph": [["t", "r", "a"]]}) + "\n")  # fmt: skip
    from kglightning.data.sources.loaders import read_records

    store = read_records(data).store
    assert store is not None and store.parent == tmp_path / "link" / "records"
    assert main(["cache", "clean", "--older-than", "0"]) == 0
    assert f"removed {store} (" in capsys.readouterr().out and not (real / "records" / store.name).exists()
