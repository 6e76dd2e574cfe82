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


def _linked_dataset(root: Path, name: str, answer: str) -> Path:
    """A ``save_to_disk`` folder whose split folder is a link to a folder beside it (``A/train -> ../A_real/train``),
    its data answering ``answer``."""
    import datasets

    real = root / f"{name}_real"
    datasets.DatasetDict({"train": datasets.Dataset.from_list([{"id": "q1", "question": "capital of France?",
        "answer": [answer], "q_entity": ["France"], "a_entity": [answer],
        "graph": [["France", "capital", answer]]}])}).save_to_disk(str(real))  # fmt: skip
    folder = root / name
    folder.mkdir()
    shutil.copy(real / "dataset_dict.json", folder)
    (folder / "train").symlink_to(Path("..") / real.name / "train")
    return folder


def test_two_dataset_folders_whose_split_folders_are_links_get_their_own_stores(root, monkeypatch):
    """Finding 1 of the second review: the key of a dataset folder covered only its own files, not those of a linked
    split folder, so two folders with other data shared one record store and the second read the first's records."""
    from kglightning.data.sources.loaders import read_records

    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    a, b = _linked_dataset(root, "A", "Paris"), _linked_dataset(root, "B", "Lyon")
    first, second = read_records(a, split="train"), read_records(b, split="train")
    assert first[0].answer == ["Paris"] and second[0].answer == ["Lyon"]
    assert first.store is not None and second.store is not None and first.store != second.store
    assert files_stamp(a) != files_stamp(b)


def test_the_walk_of_a_folder_follows_links_but_never_loops_nor_climbs(root):
    d = root / "d"
    (d / "sub").mkdir(parents=True)
    (d / "sub" / "x.bin").write_bytes(b"x")
    (d / "sub" / "loop").symlink_to(d)  # back to the top: walked once
    (d / "up").symlink_to(root)  # a folder above it: never walked (it holds d itself, and everything else)
    (root / "elsewhere.bin").write_bytes(b"outside")
    (d / "again").symlink_to(d / "sub")  # the same folder under another name: stamped as that name
    from kglightning.data.store.cache import folder_files

    files, aliases = folder_files(d)
    assert [name for name, _ in files] == ["sub/x.bin"]
    assert aliases == [("again", "sub"), ("sub/loop", "."), ("up", "above")]
    before = files_stamp(d)
    (d / "again").unlink()
    (d / "again").mkdir()  # an empty folder where the link was: other data, another stamp
    assert files_stamp(d) != before
