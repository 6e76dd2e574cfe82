"""Giving back the pages of read-only memory maps: the resident pages of the mapped file leave the process (read
from /proc/self/smaps), the values read afterwards are the same, and maps that may hold writes are left alone."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kglightning.data.embeddings import EmbeddingCache
from kglightning.data.store.mapped_pages import release_array
from kglightning.data.triple_array import TripleArray, Vocab

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def _resident_kib(path: Path) -> int:
    """KiB of ``path``'s mappings resident in this process."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's header line
            inside = len(head) >= 6 and head[-1] == str(path)
        elif inside and head and head[0] == "Rss:":
            total += int(head[1])
    return total


def _touch(array: np.ndarray) -> int:
    return int(np.asarray(array).sum(dtype=np.int64))


def _released_and_read_back(path: Path, release, read, resident_kib: int) -> None:
    """``read()`` (which maps ``path``) leaves more than ``resident_kib`` of it resident; ``release()`` drops them
    (under 1 MiB left) and says so; ``read()`` then gives the same values."""
    before = read()
    assert _resident_kib(path) > resident_kib
    assert release() > resident_kib * 1024
    assert _resident_kib(path) < 1024
    assert torch.equal(read(), before)


@linux
def test_a_read_only_memmap_gives_its_pages_back_and_reads_the_same_afterwards(tmp_path):
    path = tmp_path / "graphs.npy"
    np.save(path, np.arange(3 * 2**20, dtype=np.int32).reshape(-1, 3))  # 12 MiB
    graphs = np.load(path, mmap_mode="r")
    view = graphs[1000:2000]  # a record's slice: the whole map is released
    before = _touch(graphs)
    assert _resident_kib(path) > 10 * 1024
    assert release_array(view) >= graphs.nbytes
    assert _resident_kib(path) < 1024
    assert _touch(graphs) == before and view[0].tolist() == [3000, 3001, 3002]


@linux
def test_maps_that_may_hold_writes_and_plain_arrays_are_left_alone(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.zeros(2**20, dtype=np.int32))
    for mode in ("c", "r+"):
        a = np.load(path, mmap_mode=mode)
        a[:1000] = 7  # copy-on-write (c) or written through (r+): MADV_DONTNEED would lose it (c)
        assert release_array(a) == 0 and release_array(a[10:20]) == 0
        assert int(a[:1000].sum()) == 7000, mode
        del a
    assert release_array(np.ones(10)) == 0


@linux
def test_an_embedding_cache_gives_back_its_mapped_shards_pages_and_looks_up_the_same_rows(tmp_path):
    class Enc:
        dim, cache_key = 256, "enc"

        def encode(self, texts):
            return torch.stack([torch.full((256,), float(len(t) % 50)) for t in texts])

    texts = [f"string {i}" for i in range(40_000)]  # 20 MB of float16 rows, one mapped shard
    cache = EmbeddingCache(Enc(), tmp_path, mmap_rows=1000)
    cache.add(texts)
    shard = next((tmp_path / "enc").glob("shard-*.arrow"))
    _released_and_read_back(shard, cache.release_pages, lambda: cache.embed(texts), 15 * 1024)


@linux
def test_a_row_table_releases_its_mapped_segments_only_and_keeps_every_row(tmp_path):
    from kglightning.data.store.embedding_files import read_shard, write_shard
    from kglightning.data.store.row_table import RowTable

    path = tmp_path / "s.arrow"
    write_shard(path, [str(i) for i in range(2**15)], np.arange(2**21, dtype=np.float32).reshape(-1, 64) % 1000)
    _, mapped, is_map = read_shard(path, mapped=True)
    assert is_map
    t = RowTable()
    t.append(torch.full((3, 64), 5.0))  # in memory, then a mapped segment, then in memory again
    t.append(mapped, mapped=True)
    t.append(torch.full((2, 64), 7.0))
    ids = [0, 3, 3 + 20_000, 3 + mapped.shape[0] + 1, *range(3, 3 + mapped.shape[0], 5)]
    _released_and_read_back(path, t.release_pages, lambda: t.rows(ids), 3 * 1024)
    alone = RowTable()
    alone.append(np.ones((2**16, 64), dtype=np.float16))  # rows in memory: nothing to release
    assert alone.release_pages() == 0 and alone.rows([100]).sum() == 64
    with pytest.raises(TypeError, match="read-only numpy.memmap"):
        alone.append(np.ones((2, 64), dtype=np.float16), mapped=True)


@linux
def test_a_large_mapped_table_gives_each_chunk_s_pages_back_as_it_gathers(tmp_path):
    from kglightning.data.store.embedding_files import read_shard, write_shard
    from kglightning.data.store.row_table import ROWS_AT_ONCE, RowTable

    path = tmp_path / "s.arrow"
    write_shard(path, [str(i) for i in range(2**15)], np.arange(2**21, dtype=np.float32).reshape(-1, 64) % 1000)
    _, mapped, _ = read_shard(path, mapped=True)
    ids = np.random.default_rng(0).integers(0, mapped.shape[0], 3 * ROWS_AT_ONCE)
    resident = {}
    for threshold in (None, 0):  # None: pages stay; 0: any mapped table is large enough to give them back
        t = RowTable(release_above=threshold)
        t.append(torch.ones(2, 64))  # a segment in memory before the mapped one: the gather by segment
        t.append(mapped, mapped=True)
        got = t.rows(ids + 2)
        resident[threshold] = _resident_kib(path)
        t.release_pages()
        t.rows(ids[:100] + 2)  # a gather under a chunk keeps its pages: releasing the map would cost more
        assert _resident_kib(path) > 0
        assert torch.equal(got, torch.from_numpy(np.asarray(mapped[ids], dtype=np.float32)))
        t.release_pages()
    assert resident[None] > 3 * 1024 and resident[0] < resident[None] / 4
    assert RowTable().release_above == 256 * 2**20


@linux
def test_a_refused_release_is_logged_once_and_the_run_goes_on(tmp_path, caplog, monkeypatch):
    import ctypes
    import mmap as mmap_module

    import kglightning.data.store.mapped_pages as mapped_pages

    monkeypatch.setattr(mapped_pages, "_refused", set())
    libc = ctypes.CDLL(None, use_errno=True)
    path = tmp_path / "g.npy"
    np.save(path, np.arange(3 * 4096, dtype=np.int32).reshape(-1, 3))
    graphs = np.load(path, mmap_mode="r")
    page = graphs.ctypes.data - graphs.ctypes.data % mmap_module.PAGESIZE
    if libc.mlock(ctypes.c_void_p(page), ctypes.c_size_t(mmap_module.PAGESIZE)) != 0:
        pytest.skip("mlock is not allowed here")
    try:
        assert release_array(graphs) == 0 and release_array(graphs[:2]) == 0
    finally:
        libc.munlock(ctypes.c_void_p(page), ctypes.c_size_t(mmap_module.PAGESIZE))
    refusals = [r for r in caplog.records if "refused to drop the pages" in r.getMessage()]
    assert len(refusals) == 1 and graphs[1].tolist() == [3, 4, 5]


@linux
def test_an_unpickled_row_table_maps_its_file_again_and_releases_it(tmp_path):
    import pickle

    from kglightning.data.store.embedding_files import read_shard, write_shard
    from kglightning.data.store.row_table import RowTable

    path = tmp_path / "s.arrow"
    write_shard(path, [str(i) for i in range(2**15)], np.arange(2**21, dtype=np.float32).reshape(-1, 64) % 1000)
    t = RowTable()
    t.append(read_shard(path, mapped=True)[1], mapped=True)
    assert t.release_pages() > 0
    again = pickle.loads(pickle.dumps(t))  # a spawned worker: the file mapped anew
    assert isinstance(again.segments[0], np.memmap)
    _released_and_read_back(path, again.release_pages, lambda: again.rows(torch.arange(0, 2**15, 7)), 512)


def test_triples_in_memory_release_nothing():
    g = TripleArray.from_triples([("a", "r", "b")], Vocab())
    assert g.release_pages() == 0 and g[0] == ("a", "r", "b")


@pytest.fixture
def stored(tmp_path, monkeypatch):
    """Four questions of 25,000 triples each, loaded from the record store: graphs are views of records.arrow (1.2 MB)."""
    import json

    from kglightning.data.sources.loaders import read_records
    from kglightning.data.store.record_store import store_folder

    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KGLIGHTNING_RECORD_STORE_MIN_MB", "0")
    monkeypatch.setattr("kglightning.data.store.record_store.MAP_FROM_BYTES", 0)  # mapped as a large store is
    path = tmp_path / "train.jsonl"
    rows = [
        {"id": f"q{i}", "question": f"q {i}?", "answer": ["e1"], "q_entity": [f"t{i}"], "a_entity": ["e1"],
         "graph": [[f"t{i}", f"r{j % 4}", f"e{j}"] for j in range(25_000)], "prediction": ["e1", "e2"]}
        for i in range(4)
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    read_records(path)  # writes the store
    return read_records(path), store_folder(path, None, "raise", None) / "records.arrow"


@linux
def test_the_detector_gives_back_the_graph_pages_of_each_batch_it_built(stored):
    import datasets

    from kglightning.data.store.stage_map import cached_map
    from kglightning.datamodules.graph_rows import build_graph_rows, graph_features

    records, graphs = stored
    _touch(records[0].graph.ids)
    assert _resident_kib(graphs) > 200
    state = (records, True, "keep", lambda r: None, "readable")
    questions = datasets.Dataset.from_dict({"index": list(range(len(records)))})
    rows = cached_map(questions, build_graph_rows, graph_features(), None, state=state, batch_size=2, progress=False)
    assert list(rows["built"]) == [True] * 4 and all(n > 25_000 for n in rows["num_nodes"])
    assert _resident_kib(graphs) < 64


@linux
def test_uag_scoring_leaves_no_graph_pages_of_the_record_store_in_memory(stored, tmp_path):
    from kglightning.conformal.uag.scores import score_questions

    records, graphs = stored
    _touch(records[0].graph.ids)
    assert _resident_kib(graphs) > 200

    class Enc:
        dim, cache_key = 256, "enc"

        def encode(self, texts):
            out = torch.zeros(len(texts), 256)
            out[:, 0], out[:, 1] = torch.tensor([float(len(t)) for t in texts]), 1.0
            return torch.nn.functional.normalize(out, dim=1)

    cache = EmbeddingCache(Enc(), tmp_path / "emb", mmap_rows=1000)
    cache.add(f"e{j}" for j in range(25_000))  # the candidates' names: one mapped shard of 12.8 MB
    shard = next((tmp_path / "emb" / "enc").glob("shard-*.arrow"))
    pool = score_questions(records, cache, max_hops=1, progress=False)
    assert [s.num_entities for s in pool] == [25_000] * 4  # every graph was read, every name looked up
    assert _resident_kib(graphs) < 64 and _resident_kib(shard) < 1024


def _anon_mib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) // 1024
    raise AssertionError("no RssAnon")


@linux
def test_trimming_the_heap_gives_back_what_freed_blocks_held():
    from kglightning.data.store.mapped_pages import trim_heap

    blocks = [bytearray(16384) for _ in range(8000)]  # 125 MiB of heap blocks (each under the mmap threshold)
    keep = blocks[::64]  # every 64th stays alive, so the heap cannot simply shrink from its top
    del blocks
    held = _anon_mib()
    assert trim_heap()
    assert _anon_mib() < held - 80 and all(len(b) == 16384 for b in keep)
