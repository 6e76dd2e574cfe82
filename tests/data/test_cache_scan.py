"""What ``kglightning cache list|du|clean`` does with a folder it cannot read: it says so and goes on with the rest."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from kglightning.data.store.cache_admin import main
from kglightning.data.store.cache_marks import mark_folder


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    r = tmp_path / "cache"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(r))
    return r


def _entry(folder: Path, days: float) -> Path:
    folder.mkdir(parents=True, mode=0o700)
    (folder / "data.bin").write_bytes(b"\0" * 2048)
    mark_folder(folder)
    past = time.time() - days * 86400
    os.utime(folder / ".kglightning-entry", (past, past))
    return folder


def _unreadable(monkeypatch, *folders: Path) -> None:
    """Make listing ``folders`` fail as ``chmod 000`` (or another user's folder) makes it fail for an ordinary user
    (the tests may run as root, whom permissions do not stop)."""
    listing = Path.iterdir

    def iterdir(self):
        if self in folders:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)


@pytest.mark.parametrize("action", ["list", "du", "clean"])
def test_an_unreadable_kind_folder_is_reported_and_the_rest_goes_on(root, monkeypatch, capsys, action):
    """Finding 9 of the second review: one unreadable kind folder (``chmod 000 kg/``, or another user's) stopped
    ``cache list`` and ``clean`` with PermissionError; so did ``records/stamps``."""
    old = _entry(root / "records" / "0123456789abcdef", days=30)
    _entry(root / "kg" / "dump", days=30)
    (root / "records" / "stamps").mkdir()
    _unreadable(monkeypatch, root / "kg", root / "records" / "stamps")
    assert main([action, *(["--older-than", "7"] if action == "clean" else [])]) == 0
    out = capsys.readouterr().out
    assert f"skipped {root / 'kg'}: cannot be read (Permission denied)" in out
    assert f"skipped {root / 'records' / 'stamps'}: cannot be read (Permission denied)" in out
    if action == "clean":
        assert f"removed {old}" in out and not old.exists() and (root / "kg" / "dump").exists()
    elif action == "list":
        assert old.name in out
    else:
        assert "records" in out and "2.0 KiB" in out
