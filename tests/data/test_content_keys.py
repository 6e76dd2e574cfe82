"""Cache keys come from content: other bytes under the same name, size and modification time (``cp -p``,
``rsync -t``, an archive) give another key, and the same bytes copied elsewhere give the same key."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from kglightning.data.encoder import SentenceEncoder
from kglightning.data.store.cache import files_stamp


def _same_size_and_time(path: Path, content: bytes) -> None:
    """Rewrite ``path`` with ``content`` (of the same length) and give it back its modification time, as ``cp -p``
    or ``rsync -t`` of another version would."""
    st = path.stat()
    assert len(content) == st.st_size
    path.write_bytes(content)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_files_stamp_follows_the_bytes_not_the_size_and_time(root):
    d = root / "model"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"weights-1")
    before = files_stamp(d)
    _same_size_and_time(d / "model.safetensors", b"weights-2")
    assert files_stamp(d) != before
    copy = root / "copy"
    shutil.copytree(d, copy)  # new times, the same bytes
    assert files_stamp(copy) == files_stamp(d)


def test_the_encoder_key_changes_with_the_weights_under_the_same_name(root):
    d = root / "encoder"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(b"A" * 64)
    first = SentenceEncoder(str(d)).cache_key
    _same_size_and_time(d / "model.safetensors", b"B" * 64)  # retrained, exported to the same folder
    assert SentenceEncoder(str(d)).cache_key != first
    assert SentenceEncoder(str(d), normalize=False).cache_key != SentenceEncoder(str(d)).cache_key


def test_caches_derived_from_a_records_file_see_a_change_that_keeps_its_size_and_time(root):
    from kglightning.datamodules.base import KGQADataModule

    folder = root / "data"
    folder.mkdir()
    for split in ("train", "validation", "test"):
        (folder / f"{split}.jsonl").write_text(json.dumps({"id": f"{split}-1", "question": "capital of France?",
            "answer": ["Paris"], "q_entity": ["France"], "a_entity": ["Paris"],
            "graph": [["France", "capital", "Paris"]]}) + "\n")  # fmt: skip
    key = KGQADataModule(data_dir=str(folder)).dataset_key("train")  # what the proposals' cache is named by
    train = folder / "train.jsonl"
    _same_size_and_time(train, train.read_bytes().replace(b"Paris", b"Lyon!"))
    assert KGQADataModule(data_dir=str(folder)).dataset_key("train") != key
