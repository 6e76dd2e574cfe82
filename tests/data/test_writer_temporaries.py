"""Every writer of the cache writes ``.<name>.kgl-<host>.<pid>.tmp`` and renames it; the next writer of the same name
removes what a killed one left (its process gone and nothing written for ten minutes, or, with the token, untouched
for a day whatever its host: in the cache any host's, beside a user's file another host's of that exact name)."""

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
from kglightning.data.store.record_store import store_folder
from kglightning.data.store.temporaries import temporary_name, writer_temporary


def _dead_pid() -> int:
    out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(out.stdout)


def _plant(path: Path, host: str, pid: int, age_s: float, folder: bool, token: bool = True) -> Path:
    """A writer's temporary of ``path``: ``.<name>.kgl-<host>.<pid>.tmp``, or (``token=False``) the name the release
    before the token gave it, ``.<name>.<host>.<pid>.tmp``, untouched for ``age_s`` seconds."""
    tmp = path.with_name(f".{path.name}.{'kgl-' if token else ''}{host}.{pid}.tmp")
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
    legacy = _plant(target, host, dead, 900, folder, token=False)  # the same, named by the release before the token
    recent = _plant(target, host, dead + 1 if dead + 1 != os.getpid() else dead + 2, 0, folder)  # just written
    elsewhere = _plant(target, "another-host", os.getpid(), 900, folder)  # may still be writing over there
    old_elsewhere = _plant(target, "old-host", 1, 2 * 86400, folder)  # another host's, quiet for two days
    untokened = _plant(target, "old-host", 1, 2 * 86400, folder, token=False)  # may be a user's: never, here
    other_name = _plant(tmp_path / "other", host, dead, 900, folder)  # another entry's: not this writer's business
    mine = _plant(target, host, os.getpid(), 0, folder)  # this process's own from an earlier try
    tmp = writer_temporary(target, "a test writer")
    assert tmp == mine and not tmp.exists()
    assert not orphan.exists() and not legacy.exists() and not old_elsewhere.exists() and untokened.exists()
    assert recent.exists() and elsewhere.exists() and other_name.exists()


def test_in_the_cache_any_hosts_temporary_a_day_old_goes(tmp_path, monkeypatch):
    """Finding 3 of the second review: a container gets a new host name every run, so the temporaries of other hosts
    are the usual case. With the token, one of this user untouched for a day goes, file or folder, marked or not;
    without it (the release before), only a marked folder a day old."""
    from kglightning.data.store.cache_marks import mark_folder

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path))
    target = tmp_path / "records" / "entry"
    target.parent.mkdir()
    alive = socket.gethostname()  # this host's, with pid 1: alive (its pid taken again), but quiet for two days
    gone = [_plant(target, "old-host", 1, 2 * 86400, folder=True), _plant(target, "a.b", 1, 2 * 86400, folder=False),
            _plant(target, alive, 1, 2 * 86400, folder=False)]  # fmt: skip
    marked = _plant(target, "old-host", 1, 2 * 86400, folder=True, token=False)
    mark_folder(marked)
    os.utime(marked, (time.time() - 2 * 86400,) * 2)
    kept = [_plant(target, "older-host", 1, 2 * 86400, folder=True, token=False),  # may be anyone's folder
            _plant(target, "oldest-host", 1, 2 * 86400, folder=False, token=False),
            _plant(target, "new-host", 1, 3600, folder=True),  # an hour old: may still be written over there
            _plant(target, "busy-host", 1, 2 * 86400, folder=True)]  # fmt: skip
    os.utime(kept[-1] / "part")  # an old folder that is still being written in
    writer_temporary(target, "a test writer")
    assert not any(p.exists() for p in [*gone, marked]) and all(p.exists() for p in kept)


def test_a_record_store_temporary_of_another_host_is_a_temporary_clean_removes(tmp_path, monkeypatch, capsys):
    """Finding 3: a record-store writer killed on another host (a container) left a temporary folder; it carries the
    marker from the moment it was made, `list` shows it as a temporary (not unmarked), and `clean` removes it once it
    is a day old."""
    import signal

    from kglightning.data.store.cache_admin import main

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    data = tmp_path / "q.jsonl"
    write_records_at(data)
    code = f"""
import os, signal
import kglightning.data.store.record_store as rs
rs._batch = lambda *a: os.kill(os.getpid(), signal.SIGKILL)  # killed while the store is written
from kglightning.data.sources.loaders import read_records
read_records({str(data)!r})
"""
    killed = subprocess.run([sys.executable, "-c", code], env=os.environ)
    assert killed.returncode == -signal.SIGKILL
    (left,) = (tmp_path / "cache" / "records").glob(".*.tmp")
    assert (left / ".kglightning-entry").is_file()
    key = store_folder(data, None, "raise", None).name
    moved = left.with_name(temporary_name(key, "container-1f3a", 12345))
    left.rename(moved)  # as a writer on another host (a container with another name) left it
    main(["list"])
    assert "(unmarked" not in capsys.readouterr().out
    for p in (moved, *moved.iterdir()):
        os.utime(p, (time.time() - 2 * 86400,) * 2)
    main(["clean"])
    assert not moved.exists() and f"removed {moved}" in capsys.readouterr().out


def write_records_at(path: Path) -> None:
    from kglightning.data.sources.loaders import write_records

    write_records([KGQARecord(f"q{i}", "question?", ["a"], ["t"], ["a"], [("t", "r", "a")]) for i in range(3)], path)


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
    host, _, pid = left.name[: -len(".tmp")].removeprefix(".train.jsonl.kgl-").rpartition(".")
    assert host == socket.gethostname() and pid.isdigit()  # named so that the next writer can tell it is abandoned
    os.utime(left, (time.time() - 900,) * 2)  # nothing written in it for 15 minutes: no writer will finish it
    from kglightning.data.sources.loaders import write_records

    write_records([KGQARecord("q1", "question?", ["a"], ["t"], ["a"], [("t", "r", "a")])], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.jsonl"]


def test_write_records_leaves_a_users_look_alike_files_beside_its_output(tmp_path):
    """A user's ``.preds.jsonl.backup.20240101.tmp`` cannot be told from another host's temporary of the release
    before the token: beside a user's output, only temporaries of that exact name are removed, with the token (this
    host's whose process is gone, another host's a day old), or this host's of the release before."""
    out = tmp_path / "preds.jsonl"
    dead = _dead_pid()
    mine = [_plant(out, "backup", 20240101, 2 * 86400, folder=False, token=False),  # .preds.jsonl.backup.20240101.tmp
            tmp_path / ".preds.jsonl.mynotes1.tmp", _plant(out, "elsewhere", dead, 2 * 86400, folder=False, token=False),
            _plant(tmp_path / "preds.jsonl.x", socket.gethostname(), dead, 900, folder=False),
            _plant(tmp_path / "preds.jsonl.x", "elsewhere", dead, 2 * 86400, folder=False),
            _plant(out, "elsewhere", dead, 3600, folder=False)]  # fmt: skip
    mine[1].write_text("notes")
    os.utime(mine[1], (time.time() - 2 * 86400,) * 2)
    orphans = [_plant(out, socket.gethostname(), dead, 900, folder=False),
               _plant(out, socket.gethostname(), dead, 900, folder=False, token=False),
               _plant(out, "container-9", 1, 2 * 86400, folder=False)]  # fmt: skip
    from kglightning.data.sources.loaders import write_records

    write_records([KGQARecord("q1", "question?", ["a"], ["t"], ["a"], [("t", "r", "a")])], out)
    assert all(p.exists() for p in mine) and not any(p.exists() for p in orphans)


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


@pytest.mark.parametrize("complete", [True, False])
def test_a_rebuild_never_takes_a_users_files_put_beside_an_older_build(tmp_path, complete):
    """Third cache review: ``build-benchmark --out data/embedded`` again (another seed) deleted the notes and runs a
    user had put into the folder of the first build, with exit 0; a torn build would move them into a pile that
    ``cache clean`` removes in time."""
    out = tmp_path / "embedded"
    first = builder._build_folder(out)
    if complete:
        (first / "manifest.json").write_text("{}", encoding="utf-8")
    first.rename(out)
    (out / "NOTES.md").write_text("keep")
    (out / "my_runs").mkdir()
    tmp = builder._build_folder(out)
    (tmp / "manifest.json").write_text('{"v": 2}', encoding="utf-8")
    with pytest.raises(FileExistsError, match=r"files it did not write \(NOTES.md, my_runs\).*never removed"):
        builder._publish(tmp, out, replace=True)
    assert (out / "NOTES.md").read_text() == "keep" and (out / "my_runs").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["embedded"]


def test_a_torn_build_of_kglightning_is_set_aside(tmp_path):
    out = tmp_path / "embedded-v1-seed0"
    torn = builder._build_folder(out)  # marked, as every build is; killed before its manifest
    torn.rename(out)
    tmp = builder._build_folder(out)
    (tmp / "manifest.json").write_text("{}", encoding="utf-8")
    builder._publish(tmp, out, replace=False)
    (aside,) = tmp_path.glob("embedded-v1-seed0.unreadable-*")
    assert (out / "manifest.json").is_file() and (aside / ".kglightning-entry").is_file()


def test_build_benchmark_refuses_a_folder_with_a_users_files_before_building(tmp_path, capsys):
    from kglightning.cli import main

    out = tmp_path / "embedded"
    first = builder._build_folder(out)
    (first / "manifest.json").write_text("{}", encoding="utf-8")
    first.rename(out)
    (out / "NOTES.md").write_text("keep")
    with pytest.raises(SystemExit) as e:
        main(["build-benchmark", "--out", str(out), "--seed", "1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "files it did not write (NOTES.md)" in err and err.count("\n") == 2  # usage + error
    assert (out / "NOTES.md").read_text() == "keep"


def test_build_benchmark_under_a_file_or_onto_a_file_is_one_line_before_building(tmp_path, capsys, monkeypatch):
    """Review 4: `--out ofile/sub/x` ended in a NotADirectoryError traceback; `--out ofile` was refused only after
    the whole build."""
    from kglightning.cli import main

    def no_build():
        raise AssertionError("built before refusing")

    monkeypatch.setattr(builder, "build_knowledge_graph", no_build)
    (tmp_path / "ofile").write_text("mine")
    for out in (tmp_path / "ofile" / "sub" / "x", tmp_path / "ofile"):
        with pytest.raises(SystemExit) as e:
            main(["build-benchmark", "--out", str(out)])
        assert e.value.code == 2 and "Traceback" not in capsys.readouterr().err
    assert (tmp_path / "ofile").read_text() == "mine"
