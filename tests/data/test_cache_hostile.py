"""What another user (or a stray file) can put into the cache changes nothing outside it, hangs nothing, and never
makes kglightning delete a user's files: planted links and FIFOs at the names of the cache's own files, forged
markers, entries of other users, proposals and cut subgraphs planted for a reader."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kglightning.cli import main
from kglightning.data.store import cache as cache_mod
from kglightning.data.store.cache import content_digest
from kglightning.data.store.cache_marks import mark_folder

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="no POSIX owners and permissions")
as_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving files away needs root")
OTHER = 12345  # another user's uid


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    r = tmp_path / "cache"
    r.mkdir(mode=0o700)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(r))
    monkeypatch.delenv("KGLIGHTNING_CACHE_MAX_GB", raising=False)
    return r


def _old(path: Path, days: float = 30) -> None:
    """``path``, what it holds and the files beside it named after it, ``days`` back (links themselves)."""
    past = time.time() - days * 86400
    for p in [path, *(path.rglob("*") if path.is_dir() and not path.is_symlink() else ())]:
        os.utime(p, (past, past), follow_symlinks=False)


def _marked_entry(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "data").write_bytes(b"\0" * 100)
    mark_folder(folder)
    _old(folder)
    return folder


def _victim(tmp_path: Path) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    victim = outside / "victim.txt"
    victim.write_text("precious")
    return victim


def _memo_temporary(path: Path, root: Path) -> Path:
    """The temporary name content_digest writes the memo of ``path`` through, in this process."""
    st = path.stat()
    stamp = f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    memo = hashlib.sha1(stamp.encode()).hexdigest()[:20]
    return root / "records" / "stamps" / f".{memo}.kgl-{socket.gethostname()}.{os.getpid()}.tmp"


@pytest.mark.parametrize("shared", [True, False])
def test_a_memo_is_never_written_through_a_link_planted_at_its_temporary_name(root, tmp_path, monkeypatch, shared):
    """Finding 1: a link at the memo's temporary name, in a records folder others can write (or even in a private
    one), is not written through."""
    monkeypatch.setattr(cache_mod, "_digests", {})
    data = tmp_path / "kg.tsv"
    data.write_text("a\tr\tb\n")
    stamps = root / "records" / "stamps"
    stamps.mkdir(parents=True, mode=0o700)
    if shared:
        os.chmod(root / "records", 0o777)
        os.chmod(stamps, 0o777)
    victim = _victim(tmp_path)
    _memo_temporary(data, root).symlink_to(victim)
    assert content_digest(data) == hashlib.blake2b(data.read_bytes(), digest_size=16).hexdigest()
    assert victim.read_text() == "precious"
    assert [p.name for p in stamps.iterdir() if not p.name.startswith(".")] == ([] if shared else [])


@as_root
def test_a_memo_is_not_written_into_another_users_records_folder(root, tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod, "_digests", {})
    data = tmp_path / "kg.tsv"
    data.write_text("a\tr\tb\n")
    (root / "records").mkdir(mode=0o755)
    os.chown(root / "records", OTHER, OTHER)
    content_digest(data)
    assert not (root / "records" / "stamps").exists()  # nothing made in a folder another user owns


@pytest.mark.parametrize("shared_kind", [True, False])
def test_clean_never_creates_a_file_through_an_in_use_link(root, tmp_path, capsys, shared_kind):
    """Finding 2: an in-use file that is a link to a path outside the cache is neither opened nor created."""
    kind = root / "kg"
    kind.mkdir(mode=0o700)
    bait = _marked_entry(kind / "bait")
    outside = tmp_path / "outside" / "created-by-clean"
    outside.parent.mkdir()
    (kind / ".bait.in-use").symlink_to(outside)
    if shared_kind:
        os.chmod(kind, 0o777)
    assert main(["cache", "clean", "--older-than", "7"]) == 0
    out = capsys.readouterr().out
    assert not os.path.lexists(outside) and bait.exists()
    assert ("writable by other users" if shared_kind else "is a symbolic link") in out


@pytest.mark.parametrize("shared_kind", [True, False])
def test_an_embedding_cache_never_creates_a_file_through_an_in_use_link(root, tmp_path, shared_kind):
    import torch

    from kglightning.data.embeddings import EmbeddingCache

    class Toy:
        dim, cache_key = 2, "toy"

        def encode(self, texts):
            return torch.tensor([[len(t), 1.0] for t in texts])

    kind = root / "embeddings"
    kind.mkdir(mode=0o777 if shared_kind else 0o700)
    os.chmod(kind, 0o777 if shared_kind else 0o700)
    outside = tmp_path / "outside" / "made-by-a-read"
    outside.parent.mkdir()
    (kind / ".toy.in-use").symlink_to(outside)
    assert EmbeddingCache(Toy(), root=kind).embed(["ab"]).tolist() == [[2.0, 1.0]]
    assert not os.path.lexists(outside)
    assert (kind / "toy").exists() != shared_kind  # nothing made in a folder others can write


_CLEAN = """
    from kglightning.data.store.cache_admin import main
    assert main(["clean", "--dry-run", "--older-than", "7"]) == 0
    assert main(["clean", "--older-than", "7"]) == 0
"""
_EMBED = """
    import torch
    from kglightning.data.embeddings import EmbeddingCache
    class Toy:
        dim, cache_key = 2, "toy"
        def encode(self, texts):
            return torch.tensor([[len(t), 1.0] for t in texts])
    print(EmbeddingCache(Toy(), root={kind!r}).embed(["ab"]).tolist())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    """``code`` in a new process, stopped after 60 s (a hang is a failure, not a hung suite)."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              env=os.environ, timeout=60)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("hung on a FIFO")


def test_a_fifo_at_an_in_use_name_hangs_neither_clean_nor_a_reader(root):
    """Finding 3: clean, clean --dry-run and EmbeddingCache() return, and the entry behind the FIFO is left."""
    kind = root / "kg"
    kind.mkdir(mode=0o700)
    old = _marked_entry(kind / "old")
    os.mkfifo(kind / ".old.in-use")
    done = _run(_CLEAN)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count(f"skipped {old}: its in-use file {kind / '.old.in-use'} is a FIFO") == 2 and old.exists()
    emb = root / "embeddings"
    emb.mkdir(mode=0o700)
    os.mkfifo(emb / ".toy.in-use")
    done = _run(_EMBED.format(kind=str(emb)))
    assert done.returncode == 0 and done.stdout.strip() == "[[2.0, 1.0]]", done.stderr[-2000:]


def test_a_marker_others_can_write_is_not_believed(root, capsys):
    """Finding 4: a marker that is not a private file of this user does not make an entry kglightning's."""
    notes = root / "records" / "my_notes"
    notes.mkdir(parents=True)
    (notes / "notes.txt").write_text("important")
    (notes / ".kglightning-entry").write_text("")
    os.chmod(notes / ".kglightning-entry", 0o666)
    _old(notes)
    assert main(["cache", "clean", "--older-than", "7", "--max-size", "0"]) == 0
    out = capsys.readouterr().out
    assert (notes / "notes.txt").read_text() == "important"
    assert f"skipped {notes}: its marker .kglightning-entry is writable by other users" in out


@as_root
def test_a_marker_or_an_entry_of_another_user_is_never_removed(root, capsys):
    notes = root / "records" / "my_notes"
    notes.mkdir(parents=True, mode=0o775)
    (notes / "notes.txt").write_text("important")
    (notes / ".kglightning-entry").write_text("")
    os.chown(notes / ".kglightning-entry", OTHER, OTHER)  # a teammate's empty file, dropped into a group folder
    theirs = _marked_entry(root / "kg" / "otheruser")
    for p in (theirs, *theirs.iterdir()):
        os.chown(p, OTHER, OTHER, follow_symlinks=False)
    _old(notes)
    assert main(["cache", "clean", "--older-than", "7"]) == 0
    out = capsys.readouterr().out
    assert (notes / "notes.txt").exists() and (theirs / "data").exists()
    assert "belongs to another user (uid 12345)" in out


def test_clean_leaves_no_in_use_file_behind(root, capsys):
    """Finding 4's side effect: the in-use file a removal locks goes with the entry, unreported."""
    a, b = _marked_entry(root / "kg" / "a"), _marked_entry(root / "records" / "b")
    assert main(["cache", "clean", "--older-than", "7"]) == 0
    out = capsys.readouterr().out
    assert not a.exists() and not b.exists() and "removed 2 paths" in out
    assert list((root / "kg").iterdir()) == [] and list((root / "records").iterdir()) == []


def test_planted_proposals_are_not_read(root, caplog):
    """Finding 6: a proposals file others can write is set aside, and in a folder others can write nothing is read
    or written."""
    from kglightning.data.proposer import load_proposals, save_proposals
    from kglightning.data.records import KGQARecord

    recs = [KGQARecord("q1", "capital of France?", ["Paris"], ["France"], ["Paris"], [("France", "capital", "Paris")])]
    path = root / "proposals-v2" / "ds" / "proposer" / "train.jsonl"
    save_proposals(recs, [dataclasses.replace(recs[0], prediction=["Paris"], confidence=[0.9])], path)
    assert load_proposals(recs, path)[0].prediction == ["Paris"]
    planted = json.dumps({"id": "q1", "prediction": ["Berlin"], "confidence": [1.0], "extra": {}}) + "\n"
    path.unlink()
    path.write_text(planted)
    os.chmod(path, 0o666)
    assert load_proposals(recs, path) is None and not path.exists()  # set aside: proposed again
    assert list(path.parent.glob("train.jsonl.unreadable-*"))
    os.chmod(path.parent, 0o777)
    path.write_text(planted)
    assert load_proposals(recs, path) is None and "not read" in caplog.text
    save_proposals(recs, recs, path)
    assert path.read_text() == planted and "not kept" in caplog.text
