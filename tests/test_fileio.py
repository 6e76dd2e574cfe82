"""kglightning.fileio: whole-or-absent files that keep the permissions and links of what they replace."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from kglightning.fileio import atomic_write, clear_outputs, write_text_atomic


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_a_new_file_gets_the_umask_and_a_replaced_one_keeps_its_mode(tmp_path: Path):
    old = os.umask(0o077)
    try:
        write_text_atomic(tmp_path / "new.txt", "x")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "new.txt") == 0o600
    private = tmp_path / "private.json"
    private.write_text("{}")
    private.chmod(0o640)
    write_text_atomic(private, "[]")
    assert private.read_text() == "[]" and _mode(private) == 0o640


def test_a_symlink_is_followed_and_kept(tmp_path: Path):
    target = tmp_path / "real.txt"
    target.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(target)
    write_text_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path):
    out = tmp_path / "a.jsonl"
    out.write_text("whole\n")
    with pytest.raises(RuntimeError), atomic_write(out, fsync=True) as f:
        f.write("half")
        raise RuntimeError
    assert out.read_text() == "whole\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]
    with atomic_write(out, "wb", fsync=True) as f:
        f.write(b"bytes")
    assert out.read_bytes() == b"bytes"
    assert clear_outputs([out, tmp_path / "missing"]) == [out] and not out.exists()


def test_each_predicted_split_gets_its_own_folder():
    """Issue 59: outputs of different splits never share a file name, whichever split a pipeline predicts."""
    from types import SimpleNamespace

    from kglightning.fileio import SplitOutputs, predicted_split, split_folder

    class Pipeline(SplitOutputs):
        def __init__(self, output_dir: str, split: str | None) -> None:
            self.output_dir = output_dir
            self._trainer = SimpleNamespace(datamodule=SimpleNamespace(predict_split=split))

    assert Pipeline("outputs/uag", "test").run_dir() == Path("outputs/uag/test")
    assert Pipeline("outputs/uag", "validation").run_dir() == Path("outputs/uag/validation")
    assert Pipeline("runs/{split}/uag", "train").run_dir() == Path("runs/train/uag")
    assert Pipeline("outputs/uag", None).run_dir() == Path("outputs/uag/predict")  # no split named
    assert predicted_split(None) == predicted_split(SimpleNamespace()) == "predict"
    assert split_folder(Path("a"), "test") == Path("a/test")
