"""Every writer of the cache writes ``.<name>.<host>.<pid>.tmp`` and renames it; the next writer of the same name
removes what a killed one left (its process gone and nothing written for ten minutes, or a day old anywhere)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kglightning.data.proposer import load_proposals, save_proposals
from kglightning.data.records import KGQARecord
from kglightning.data.sources.embedded import builder
from kglightning.data.store.temporaries import writer_temporary


def _dead_pid() -> int:
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(out.stdout)


def _plant(path: Path, host: str, pid: int, age_s: float, folder: bool) -> Path:
    tmp = path.with_name(f".{path.name}.{host}.{pid}.tmp")
    if folder:
        tmp.mkdir()
        (tmp / "part").write_bytes(b"\0" * 1024)
        os.utime(tmp / "part", (time.time() - age_s,) * 2)
    else:
        tmp.write_bytes(b"\0" * 1024)
    os.utime(tmp, (time.time() - age_s,) * 2)
    return tmp


@pytest.mark.parametrize("folder", [False, True])
def test_writer_temporary_removes_only_what_no_writer_will_finish(tmp_path, folder):
    target = tmp_path / "entry"
    host, dead = socket.gethostname(), _dead_pid()
    orphan = _plant(target, host, dead, 900, folder)  # its process gone, quiet for 15 minutes
    recent = _plant(target, host, dead + 1 if dead + 1 != os.getpid() else dead + 2, 0, folder)  # just written
    elsewhere = _plant(target, "another-host", os.getpid(), 900, folder)  # may still be writing over there
    old_elsewhere = _plant(target, "old-host", 1, 2 * 86400, folder)  # another host's: outside the cache, never
    other_name = _plant(tmp_path / "other", host, dead, 900, folder)  # another entry's: not this writer's business
    mine = _plant(target, host, os.getpid(), 0, folder)  # this process's own from an earlier try
    tmp = writer_temporary(target, "a test writer")
    assert tmp == mine and not tmp.exists()
    assert not orphan.exists() and old_elsewhere.exists()
    assert recent.exists() and elsewhere.exists() and other_name.exists()


def test_in_the_cache_another_hosts_temporary_goes_only_as_a_marked_folder_a_day_old(tmp_path, monkeypatch):
    from kglightning.data.store.cache_marks import mark_folder

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path))
    target = tmp_path / "records" / "entry"
    target.parent.mkdir()
    marked = _plant(target, "old-host", 1, 2 * 86400, folder=True)
    mark_folder(marked)
    os.utime(marked, (time.time() - 2 * 86400,) * 2)
    unmarked = _plant(target, "older-host", 1, 2 * 86400, folder=True)  # may be anyone's folder of such a name
    a_file = _plant(target, "oldest-host", 1, 2 * 86400, folder=False)
    young = _plant(target, "new-host", 1, 3600, folder=True)
    mark_folder(young)
    writer_temporary(target, "a test writer")
    assert not marked.exists() and unmarked.exists() and a_file.exists() and young.exists()


def test_the_next_proposals_writer_removes_a_killed_ones_file(tmp_path):
    rec = KGQARecord("q1", "question?", ["a"], ["t"], ["a"], [("t", "r", "a")])
    path = tmp_path / "proposals.jsonl"
    orphan = _plant(path, socket.gethostname(), _dead_pid(), 900, folder=False)
    save_proposals([rec], [rec], path)
    assert not orphan.exists() and load_proposals([rec], path) == [rec]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["proposals.jsonl"]


def test_a_failed_proposals_write_leaves_no_temporary(tmp_path):
    rec = KGQARecord("q1", "question?", ["a"], ["t"], ["a"], [("t", "r", "a")])
    with pytest.raises(ValueError):  # zip(strict=True): fewer proposals than records
        save_proposals([rec, rec], [rec], tmp_path / "proposals.jsonl")
    assert list(tmp_path.iterdir()) == []


def test_the_next_embedded_build_removes_a_killed_builds_folder(tmp_path):
    out = tmp_path / "embedded-v1"
    orphan = _plant(out, socket.gethostname(), _dead_pid(), 900, folder=True)
    aside = out.with_name(f".{out.name}.old.{socket.gethostname()}.{_dead_pid()}.tmp")  # moved aside, then killed
    aside.mkdir()
    os.utime(aside, (time.time() - 900,) * 2)
    tmp = builder._build_folder(out)
    (tmp / "manifest.json").write_text("{}", encoding="utf-8")
    builder._publish(tmp, out, replace=True)
    assert not orphan.exists() and not aside.exists() and (out / "manifest.json").is_file()
    again = builder._build_folder(out)  # a second build replaces the first: the old one is moved aside and removed
    (again / "manifest.json").write_text('{"v": 2}', encoding="utf-8")
    builder._publish(again, out, replace=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["embedded-v1"]
    assert (out / "manifest.json").read_text(encoding="utf-8") == '{"v": 2}'


def test_a_name_with_glob_characters_finds_its_own_temporaries_only(tmp_path):
    target = tmp_path / "run[1]*.jsonl"
    dead = _dead_pid()
    orphan = _plant(target, socket.gethostname(), dead, 900, folder=False)
    lookalike = _plant(tmp_path / "run1x.jsonl", socket.gethostname(), dead, 900, folder=False)  # what run[1]* matches
    writer_temporary(target, "a test writer")
    assert not orphan.exists() and lookalike.exists()


def test_write_records_killed_mid_write_leaves_a_temporary_the_next_write_removes(tmp_path):
    out = tmp_path / "train.jsonl"
    code = f"""
import os, signal
from kglightning.data.records import KGQARecord
from kglightning.data.sources.loaders import write_records
def records():
    for i in range(3):
        yield KGQARecord(f"q{{i}}", "question?", ["a"], ["t"], ["a"], [("t", "r", "a")])
        os.kill(os.getpid(), signal.SIGKILL)  # kill -9 part-way through the write
write_records(records(), {str(out)!r})
"""
    killed = subprocess.run([sys.executable, "-c", code], env=os.environ)
    assert killed.returncode == -9
    (left,) = tmp_path.glob(".train.jsonl.*.tmp")
    host, _, pid = left.name[: -len(".tmp")].removeprefix(".train.jsonl.").rpartition(".")
    assert host == socket.gethostname() and pid.isdigit()  # named so that the next writer can tell it is abandoned
    os.utime(left, (time.time() - 900,) * 2)  # nothing written in it for 15 minutes: no writer will finish it
    from kglightning.data.sources.loaders import write_records

    write_records([KGQARecord("q1", "question?", ["a"], ["t"], ["a"], [("t", "r", "a")])], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]


def test_write_records_leaves_a_users_look_alike_files_beside_its_output(tmp_path):
    """A user's ``.preds.jsonl.backup.20240101.tmp`` cannot be told from an old mkstemp or another host's temporary:
    beside a user's output, only this host's temporaries of that exact name whose process is gone are removed."""
    out = tmp_path / "preds.jsonl"
    dead = _dead_pid()
    mine = [_plant(out, "backup", 20240101, 2 * 86400, folder=False),  # .preds.jsonl.backup.20240101.tmp
            tmp_path / ".preds.jsonl.mynotes1.tmp", _plant(out, "elsewhere", dead, 2 * 86400, folder=False),
            _plant(tmp_path / "preds.jsonl.x", socket.gethostname(), dead, 900, folder=False)]  # fmt: skip
    mine[1].write_text("notes")
    os.utime(mine[1], (time.time() - 2 * 86400,) * 2)
    orphan = _plant(out, socket.gethostname(), dead, 900, folder=False)
    from kglightning.data.sources.loaders import write_records

    write_records([KGQARecord("q1", "question?", ["a"], ["t"], ["a"], [("t", "r", "a")])], out)
    assert all(p.exists() for p in mine) and not orphan.exists()


def test_a_build_never_removes_a_folder_kglightning_did_not_build(tmp_path):
    """Finding 5: a user's folder at the benchmark's name (no kglightning marker) stops the build with its name."""
    out = tmp_path / "embedded-v1-seed0"
    out.mkdir()
    (out / "my-notes.txt").write_text("keep")
    tmp = builder._build_folder(out)
    (tmp / "manifest.json").write_text("{}", encoding="utf-8")
    with pytest.raises(FileExistsError, match=f"{out} exists and is not a build of kglightning .*move it away"):
        builder._publish(tmp, out, replace=False)
    assert (out / "my-notes.txt").read_text() == "keep" and not (out / "manifest.json").exists()


def test_a_torn_build_of_kglightning_is_set_aside(tmp_path):
    out = tmp_path / "embedded-v1-seed0"
    torn = builder._build_folder(out)  # marked, as every build is; killed before its manifest
    torn.rename(out)
    tmp = builder._build_folder(out)
    (tmp / "manifest.json").write_text("{}", encoding="utf-8")
    builder._publish(tmp, out, replace=False)
    (aside,) = tmp_path.glob("embedded-v1-seed0.unreadable-*")
    assert (out / "manifest.json").is_file() and (aside / ".kglightning-entry").is_file()
