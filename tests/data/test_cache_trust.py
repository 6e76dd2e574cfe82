"""A cache file is read only when it is the user's own and passes a full Arrow validation: a planted or damaged
record store or embedding shard is set aside (with a WARNING) and built again, never trusted, never a crash."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
import torch

from kglightning.data.embeddings import EmbeddingCache
from kglightning.data.sources.loaders import read_records
from kglightning.data.store.embedding_files import write_shard
from kglightning.data.store.record_store import store_folder

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="no POSIX owners and permissions")


class Toy:
    """An encoder whose vectors say which string they are: ``[len(text), first letter's code]``."""

    dim, cache_key = 2, "toy"

    def encode(self, texts):
        return torch.tensor([[float(len(t)), float(ord(t[0]))] for t in texts])


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    r = tmp_path / "cache"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(r))
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    return r


def _records(path: Path, n: int = 40, word: str = "question") -> Path:
    path.write_text("".join(json.dumps({"id": f"q{i}", "question": f"{word} {i}?", "answer": ["x"], "q_entity": ["a"],
                                        "a_entity": [], "graph": [["a", "r", f"b{i}"]]}) + "\n" for i in range(n)))  # fmt: skip
    return path


def _plant_berlin(folder: Path) -> Path:
    """A shard that another user could have written: ``Berlin`` with the vector of ``Paris``, named to sort first."""
    planted = folder / "shard-0000000000000000.arrow"
    write_shard(planted, ["Berlin"], Toy().encode(["Paris"]).numpy())
    return planted


def test_a_planted_shard_others_can_write_is_set_aside_and_its_strings_encoded_again(root, caplog):
    EmbeddingCache(Toy(), root / "embeddings").add(["Paris", "Berlin"])
    folder = root / "embeddings" / "toy"
    planted = _plant_berlin(folder)
    os.chmod(planted, 0o666)
    with caplog.at_level(logging.WARNING):
        berlin = EmbeddingCache(Toy(), root / "embeddings").embed(["Berlin"])
    assert berlin.tolist() == Toy().encode(["Berlin"]).tolist()  # not the vector of Paris
    assert "is writable by other users" in caplog.text and not planted.exists()
    assert (folder / f"{planted.name}.unreadable").exists()


def test_a_folder_others_can_write_is_not_used_at_all(root, caplog):
    folder = root / "embeddings" / "toy"
    EmbeddingCache(Toy(), root / "embeddings").add(["Paris"])
    _plant_berlin(folder)
    os.chmod(folder, 0o777)
    with caplog.at_level(logging.WARNING):
        cache = EmbeddingCache(Toy(), root / "embeddings")
        assert cache.embed(["Berlin"]).tolist() == Toy().encode(["Berlin"]).tolist()
    assert "is not used" in caplog.text and len(cache) == 1  # kept in memory only
    assert (folder / "shard-0000000000000000.arrow").exists()  # a folder others can write is not written either


def test_a_record_store_others_can_write_is_set_aside_and_the_file_read(root, tmp_path, caplog):
    src = _records(tmp_path / "train.jsonl")
    read_records(src)
    folder = store_folder(src, None, "raise", None)
    other = _records(tmp_path / "other.jsonl", word="planted")  # a store of other records, put in its place
    read_records(other)
    planted = store_folder(other, None, "raise", None)
    os.rename(folder, tmp_path / "real")
    os.rename(planted, folder)
    os.chmod(folder / "records.arrow", 0o666)
    with caplog.at_level(logging.WARNING):
        got = read_records(src)
    assert got[0].question == "question 0?" and "is writable by other users" in caplog.text
    assert list(folder.parent.glob(f"{folder.name}.unreadable-*")) and (folder / "meta.json").is_file()


def _damage_offsets(path: Path, column: str, width: int) -> None:
    """Write an offset far past the end of ``column``'s data into the Arrow stream at ``path``."""
    raw = path.read_bytes()
    buf = pa.py_buffer(raw)
    batch = next(iter(pa.ipc.open_stream(buf)))
    at = batch.column(column).buffers()[1].address - buf.address + 3 * width
    damaged = bytearray(raw)
    damaged[at : at + width] = (2**30).to_bytes(width, "little")
    path.write_bytes(bytes(damaged))


_READ_RECORDS = """
    import os
    from kglightning.data.sources.loaders import read_records
    records = read_records({src!r})
    print(len(records), records[10].question)
"""
_READ_SHARDS = """
    import torch
    from kglightning.data.embeddings import EmbeddingCache
    class Toy:
        dim, cache_key = 2, "toy"
        def encode(self, texts):
            return torch.tensor([[float(len(t)), float(ord(t[0]))] for t in texts])
    print(EmbeddingCache(Toy(), {folder!r}).embed(["Berlin"]).tolist())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    """``code`` in a new process (a crash shows as a signal in its return code)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=os.environ)


def test_a_record_store_with_offsets_out_of_range_is_set_aside_not_a_crash(root, tmp_path):
    src = _records(tmp_path / "train.jsonl")
    read_records(src)
    folder = store_folder(src, None, "raise", None)
    _damage_offsets(folder / "records.arrow", "question", 4)
    done = _run(_READ_RECORDS.format(src=str(src)))
    assert done.returncode == 0, done.stderr[-2000:]  # was -11 (SIGSEGV)
    assert done.stdout.split("\n")[0] == "40 question 10?" and "cannot be read as a record store" in done.stderr
    assert list(folder.parent.glob(f"{folder.name}.unreadable-*"))


def test_an_embedding_shard_with_offsets_out_of_range_is_set_aside_not_a_crash(root):
    EmbeddingCache(Toy(), root / "embeddings").add(["Paris", "Berlin", "Rome", "Madrid"])
    (shard,) = (root / "embeddings" / "toy").glob("shard-*.arrow")
    _damage_offsets(shard, "text", 8)
    done = _run(_READ_SHARDS.format(folder=str(root / "embeddings")))
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[[6.0, 66.0]]" and "not a whole embedding shard" in done.stderr
    assert (shard.parent / f"{shard.name}.unreadable").exists()


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving a file away needs root")
def test_a_shard_owned_by_another_user_is_not_read(root, caplog):
    EmbeddingCache(Toy(), root / "embeddings").add(["Paris", "Berlin"])
    planted = _plant_berlin(root / "embeddings" / "toy")
    os.chown(planted, 12345, 12345)
    with caplog.at_level(logging.WARNING):
        berlin = EmbeddingCache(Toy(), root / "embeddings").embed(["Berlin"])
    assert berlin.tolist() == Toy().encode(["Berlin"]).tolist() and "belongs to another user (uid 12345)" in caplog.text
