"""The cache root is made ``0700`` by whichever writer needs it first, whatever the folder above it (a group-writable
``~/.cache`` is common), and then checked like every folder below it: every writer treats it the same way."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import datasets
import pytest
import torch

from kglightning.data.embeddings import EmbeddingCache
from kglightning.data.proposer import save_proposals
from kglightning.data.records import KGQARecord
from kglightning.data.sources.loaders import read_records
from kglightning.data.sources.triples import load_kg
from kglightning.data.store.cache_pins import pin, unpin
from kglightning.data.store.stage_map import cached_map

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="no POSIX owners and permissions")


class Toy:
    dim, cache_key = 2, "toy"

    def encode(self, texts):
        return torch.tensor([[float(len(t)), 1.0] for t in texts])


def _kg(root: Path, data: Path) -> Path:
    load_kg(data / "kg.tsv")
    return root / "kg"


def _records(root: Path, data: Path) -> Path:
    read_records(data / "q.jsonl")
    return root / "records"


def _proposals(root: Path, data: Path) -> Path:
    rec = KGQARecord("q1", "question?", ["a"], ["t"], ["a"], [("t", "r", "a")])
    save_proposals([rec], [rec], root / "proposals-v2" / "ds" / "proposer.jsonl")
    return root / "proposals-v2"


def _map(root: Path, data: Path) -> Path:
    features = datasets.Features({"y": datasets.Value("int64")})
    cached_map(datasets.Dataset.from_dict({"x": [1, 2]}), lambda b: {"y": b["x"]}, features, root / "pcst-cuts" / "fp",
               progress=False)  # fmt: skip
    return root / "pcst-cuts"


def _embeddings(root: Path, data: Path) -> Path:
    EmbeddingCache(Toy(), root / "embeddings").add(["Paris"])
    return root / "embeddings"


def _pin(root: Path, data: Path) -> Path:
    unpin(pin(root / "embeddings" / "toy"))
    return root / "embeddings"


WRITERS: dict[str, Callable[[Path, Path], Path]] = {"kg": _kg, "records": _records, "proposals": _proposals,
                                                    "map": _map, "embeddings": _embeddings, "pin": _pin}  # fmt: skip


@pytest.fixture
def data(tmp_path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    (d / "kg.tsv").write_text("a\tr\tb\n")
    (d / "q.jsonl").write_text(json.dumps({"id": "q1", "question": "capital of France?", "answer": ["Paris"],
                                           "q_entity": ["France"], "a_entity": ["Paris"],
                                           "graph": [["France", "capital", "Paris"]]}) + "\n")  # fmt: skip
    return d


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writer_makes_a_missing_root_private_under_a_group_writable_parent(tmp_path, monkeypatch, data, writer):
    """Finding 7 of the second review: under a group-writable ``~/.cache`` (0775, common on Ubuntu) the KG index,
    proposals, map steps, embeddings and pins refused to make the cache root, while the record store made it; the
    refusal protected nothing (the root is made 0700)."""
    parent = tmp_path / "home" / ".cache"
    parent.mkdir(parents=True)
    os.chmod(parent, 0o775)
    root = parent / "kglightning"
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(root))
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    kind = WRITERS[writer](root, data)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and kind.is_dir()
    assert stat.S_IMODE(parent.stat().st_mode) == 0o775  # the folder above is not the cache's business


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_writer_refuses_a_root_others_can_write(tmp_path, monkeypatch, data, writer):
    """The root itself is checked like every folder below it: no writer makes a kind folder in a root that others
    can write (the record store used to)."""
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(root))
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    kind = WRITERS[writer](root, data)
    assert not kind.exists() and list(root.iterdir()) == []


def test_the_embedded_benchmark_is_neither_read_nor_built_in_a_root_others_can_write(tmp_path, monkeypatch):
    """Finding 2: in a group-writable cache root the builder built, its next reader refused the build and set it
    aside, and built again, every run, leaving piles that clean could not reach. It stops, saying what to do."""
    from kglightning.data.sources import embedded

    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o775)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(root))
    monkeypatch.setattr(embedded, "build_embedded_benchmark", lambda *a, **k: pytest.fail("built"))
    with pytest.raises(PermissionError, match=f"{root} is not trusted .*writable by other users.*chmod go-w"):
        embedded.ensure_embedded_benchmark(seed=0)
    assert list(root.iterdir()) == []


def test_a_build_into_a_cache_folder_others_can_write_is_refused_before_it_starts(tmp_path, monkeypatch):
    from kglightning.data.sources.embedded import builder

    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o775)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(root))
    monkeypatch.setattr(builder, "build_knowledge_graph", lambda: pytest.fail("built"))
    with pytest.raises(PermissionError, match="builds nothing in a cache folder other users could change"):
        builder.build_embedded_benchmark(root / "embedded-v1-seed0")
    assert list(root.iterdir()) == []
