"""locate_splits: which file serves each split of a dataset folder, and clear errors when one is missing."""

from __future__ import annotations

import pytest

from kglightning.data.splits import SPLITS, locate_splits


def _touch(folder, *names):
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")


def test_plain_files_and_aliases(tmp_path):
    _touch(tmp_path, "train.jsonl", "dev.parquet", "test.json")
    out = locate_splits(str(tmp_path))
    assert out == {
        "train": (str(tmp_path / "train.jsonl"), None),
        "validation": (str(tmp_path / "dev.parquet"), None),
        "test": (str(tmp_path / "test.json"), None),
    }


@pytest.mark.parametrize("alias", ["validation", "val", "valid", "dev"])
def test_every_validation_alias(tmp_path, alias):
    _touch(tmp_path, "train.jsonl", f"{alias}.jsonl", "test.jsonl")
    assert locate_splits(str(tmp_path))["validation"][0] == str(tmp_path / f"{alias}.jsonl")


def test_first_alias_and_suffix_win(tmp_path):
    _touch(tmp_path, "train.parquet", "train.jsonl", "validation.jsonl", "val.jsonl", "test.jsonl")
    out = locate_splits(str(tmp_path))
    assert out["train"][0] == str(tmp_path / "train.jsonl")  # .jsonl before .parquet
    assert out["validation"][0] == str(tmp_path / "validation.jsonl")  # "validation" before "val"


def test_saved_datasets_folders(tmp_path):
    whole = tmp_path / "dict"
    _touch(whole, "dataset_dict.json")
    assert locate_splits(str(whole)) == {s: (str(whole), s) for s in SPLITS}
    hub_copy = tmp_path / "hub"
    _touch(hub_copy, "data/train-00000-of-00001.parquet")
    assert locate_splits(str(hub_copy)) == {s: (str(hub_copy), s) for s in SPLITS}
    per_split = tmp_path / "per_split"
    for split in ("train", "val", "test"):
        _touch(per_split, f"{split}/dataset_info.json")
    assert locate_splits(str(per_split))["validation"] == (str(per_split / "val"), None)


def test_hub_names_are_passed_through():
    assert locate_splits("hf:rmanluo/RoG-webqsp") == {s: ("hf:rmanluo/RoG-webqsp", s) for s in SPLITS}


def test_missing_split_names_the_folder_and_the_split(tmp_path):
    _touch(tmp_path, "train.jsonl", "test.jsonl", "notes.txt")
    with pytest.raises(FileNotFoundError, match=r"split\(s\) \['validation'\]") as err:
        locate_splits(str(tmp_path))
    assert str(tmp_path) in str(err.value)


def test_not_a_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        locate_splits(str(tmp_path / "missing"))
    _touch(tmp_path, "file.jsonl")
    with pytest.raises(FileNotFoundError, match="use null for the embedded benchmark"):
        locate_splits(str(tmp_path / "file.jsonl"))
