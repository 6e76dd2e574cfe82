"""Cache entries in use: pinned by the processes that use them, left alone by clean and the size cap."""

from __future__ import annotations

import gc
import os
import pickle
import stat
import threading
import time

import pytest

from kglightning.data.store import cache_pins
from kglightning.data.store.cache_pins import marker, pin, removable, unpin

pytestmark = pytest.mark.skipif(cache_pins.fcntl is None, reason="no fcntl (Windows): nothing is pinned")


class _Encoder:
    cache_key = "enc"


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cache_pins, "_pinned", {})
    return tmp_path / "cache"


def _in_use(entry) -> bool:
    with removable(entry) as busy:
        return busy is not None


def test_a_pin_makes_private_folders_and_is_counted(root):
    old = os.umask(0o002)
    try:
        entry = pin(root / "embeddings" / "enc" / "shard-1.arrow")
    finally:
        os.umask(old)
    assert entry == root / "embeddings" / "enc"
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in (root, root / "embeddings"))  # as private_dir makes
    assert pin(entry) == entry and _in_use(entry)
    unpin(entry)
    assert _in_use(entry)  # pinned twice, released once
    unpin(entry)
    assert not _in_use(entry)
    assert pin(root.parent / "elsewhere") is None  # outside the cache: nothing to pin


def test_an_embedding_cache_and_its_copies_pin_their_folder(root):
    from kglightning.data.embeddings import EmbeddingCache

    cache = EmbeddingCache(_Encoder(), root / "embeddings")
    entry = root / "embeddings" / "enc"
    assert _in_use(entry)
    copy = pickle.loads(pickle.dumps(cache))  # what a DataLoader worker gets
    del cache
    gc.collect()
    assert _in_use(entry)  # the copy still uses it
    del copy
    gc.collect()
    assert not _in_use(entry)


def test_a_pin_waits_for_a_removal_and_ends_on_the_current_marker(root):
    entry = root / "pcst-cuts" / "fp"
    entry.mkdir(parents=True)
    pinned = []
    with removable(entry) as busy:  # a removal holds the (new) marker exclusively
        assert busy is None and marker(entry).exists()
        waiter = threading.Thread(target=lambda: pinned.append(pin(entry)))
        waiter.start()
        time.sleep(0.3)
        assert not pinned  # waits for the removal to end
        marker(entry).unlink()  # clean removed the marker too
    waiter.join(10)
    assert pinned == [entry] and _in_use(entry)  # on a marker that exists, not on the unlinked one
