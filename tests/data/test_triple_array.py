import pickle
import random

import numpy as np
import pytest
import torch

from kglightning.data.embeddings import EmbeddingCache
from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.data.sources.loaders import read_records, write_records
from kglightning.data.triple_array import TripleArray, Vocab, graph_nodes


def _random_graph(rng: random.Random, n: int) -> list[tuple[str, str, str]]:
    names = [f"e{i}" for i in range(max(3, n // 3))] + ["É", "a b", "Z", "_x", "10", "9"]
    rels = ["location.country.capital", "people.person.spouse", "film.film.genre"]
    return [(rng.choice(names), rng.choice(rels), rng.choice(names)) for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_reads_iterates_and_compares_as_the_list_it_stands_for(seed):
    rng = random.Random(seed)
    triples = _random_graph(rng, 40)
    vocab = Vocab()
    g = TripleArray.from_triples(triples, vocab)
    assert len(g) == 40 and list(g) == triples and g.tolist() == triples and g == triples
    assert [g[i] for i in range(-3, 3)] == [triples[i] for i in range(-3, 3)]
    assert g[5:9] == triples[5:9] and list(reversed(g)) == triples[::-1]
    assert triples[7] in g and ("nope", "r", "x") not in g
    assert list(dict.fromkeys(g)) == list(dict.fromkeys(triples))
    assert graph_nodes(g) == graph_nodes(triples)
    assert g + [("a", "b", "c")] == [*triples, ("a", "b", "c")]
    assert g != triples[:-1]
    other = TripleArray.from_triples(triples, Vocab())  # another vocabulary, same triples
    assert other == g
    with pytest.raises(IndexError):
        g[40]


def test_shares_strings_and_pickles_alone_with_only_its_own():
    vocab = Vocab()
    a = TripleArray.from_triples([("Paris", "capital", "France")] * 3, vocab)
    b = TripleArray.from_triples([("Paris", "in", "Europe")], vocab)
    assert len(vocab) == 5 and a.ids.dtype == np.int32 and a.ids.shape == (3, 3)
    c = pickle.loads(pickle.dumps(b))
    assert c == b and c.vocab.strings == ["Paris", "in", "Europe"]  # not France nor capital
    both = pickle.loads(pickle.dumps([a, b]))
    assert both == [a, b]


def test_kg_index_from_ids_equals_index_from_strings():
    rng = random.Random(3)
    vocab = Vocab()
    for _ in range(5):
        triples = _random_graph(rng, 200)
        g = TripleArray.from_triples(triples, vocab)  # new strings after the last sort: the string path
        for extra in ([], ["lonely"]):  # the vocabulary's sort order, then the names' own sort
            for _ in range(2):  # the second time every string of g is covered by the sort
                want, got = KGIndex(triples, entities=extra), KGIndex(g, entities=extra)
                assert got.entities == want.entities and got.relations == want.relations
                assert [np.array_equal(x, y) for x, y in zip(got.edge_ids(), want.edge_ids())] == [True] * 3
                assert got.edges("e1") == want.edges("e1")
                vocab.sort_rank()
    with pytest.raises(ValueError, match="reverse hops"):
        KGIndex(TripleArray.from_triples([("a", "~r", "b")], vocab))


def test_read_records_keeps_graphs_compact_and_round_trips(tmp_path):
    rows = [KGQARecord(f"q{i}", "?", ["x"], ["e0"], ["x"], _random_graph(random.Random(i), 30)) for i in range(4)]
    path = tmp_path / "r.jsonl"
    write_records(rows, path)
    records = read_records(path)
    assert all(isinstance(r.graph, TripleArray) and r.graph.vocab is records.vocab for r in records)
    assert [r.graph for r in records] == [r.graph for r in rows] and records == rows
    write_records(records, tmp_path / "again.jsonl")
    assert (tmp_path / "again.jsonl").read_text() == path.read_text()


class _Count:
    dim, cache_key = 4, "count"

    def __init__(self) -> None:
        self.calls = 0

    def encode(self, texts):
        self.calls += 1
        return torch.tensor([[len(t), 1.0, 0.0, float(sum(map(ord, t)) % 7)] for t in texts])


@pytest.mark.parametrize("root", [None, "disk"])
def test_embedding_cache_grows_in_place_and_keeps_its_rows(tmp_path, root):
    enc = _Count()
    cache = EmbeddingCache(enc, None if root is None else tmp_path)
    seen, capacities = [], set()
    n = 2600 if root is None else 300  # past two growths of the buffer (1024 rows, then 1536, 2304, 3456)
    for i in range(n):  # one new string per call, as a question-by-question loop adds them
        texts = [f"text {i}", f"text {i // 2}"]
        out = cache.embed(texts)
        seen.append((texts, out))
        capacities.add(cache._table._tail.shape[0])
    table = cache.table
    assert table.shape == (n, 4) and len(cache) == n and enc.calls == n
    for texts, out in seen:  # every row stays what it was when first returned, across the growths
        assert torch.equal(cache.embed(texts), out)
    if root is None:
        assert sorted(capacities) == [1024, 1536, 2304, 3456]
    else:  # a second cache reads the shards back, in the same order
        again = EmbeddingCache(_Count(), tmp_path)
        everything = [f"text {i}" for i in range(n)]
        assert torch.equal(again.embed(everything), cache.embed(everything))
        assert len(again._table.segments) == 1  # small shards are read into the one in-memory segment


def test_embedding_cache_maps_large_shards_and_reads_rows_across_segments(tmp_path):
    """Shards of ``mmap_rows`` rows or more stay memory-mapped, each its own segment between in-memory ones; rows
    looked up across segments are the rows the shards hold, in float32."""
    writer = EmbeddingCache(_Count(), tmp_path)
    batches = [[f"s{i}"] for i in range(3)] + [[f"big{j}" for j in range(50)]] + [["t0"], ["t1"]]
    batches += [[f"huge{j}" for j in range(70)]]
    for b in batches:
        writer.add(b)
    reader = EmbeddingCache(_Count(), tmp_path, mmap_rows=40)
    everything = [t for b in batches for t in b]
    assert len(reader) == len(everything)
    mapped = [seg for seg in reader._table.segments if seg.shape[0] in (50, 70)]
    assert len(mapped) == 2 and all(seg.dtype == np.float16 for seg in reader._table.segments)
    assert all(isinstance(seg, np.memmap) for seg in mapped)
    assert len(reader._table.segments) >= 3  # in memory, mapped, ..., with the small shards' rows in between
    ids = reader.ids(everything[::-1])
    assert torch.equal(reader.rows(ids), writer.embed(everything[::-1]))
    assert reader.rows(ids[:124].view(-1, 2)).shape == (62, 2, 4)
    assert torch.equal(reader.table[ids], reader.rows(ids)) and reader.rows([]).shape == (0, 4)
    reader.add(["fresh one"])  # a row encoded after the mapped shards goes into a new in-memory tail
    assert torch.equal(reader.embed(["fresh one"]), writer.embed(["fresh one"]))
    assert _Count().encode(["fresh one"]).half().float().equal(reader.embed(["fresh one"]))


def test_embedding_cache_loads_many_shards_in_bounded_chunks(tmp_path, monkeypatch):
    """Shards are opened a chunk at a time (each open shard is a memory map); the table read back is the same."""
    import kglightning.data.embeddings as embeddings

    writer = EmbeddingCache(_Count(), tmp_path)
    batches = [[f"w{i}", f"x{i}"] for i in range(9)] + [[f"big{j}" for j in range(12)]] + [["last"]]
    for b in batches:
        writer.add(b)
    monkeypatch.setattr(embeddings, "_SHARDS_AT_ONCE", 4)
    reader = EmbeddingCache(_Count(), tmp_path, mmap_rows=10)
    everything = [t for b in batches for t in b]
    assert len(reader) == len(everything) and torch.equal(reader.embed(everything), writer.embed(everything))
    assert sum(seg.shape[0] == 12 for seg in reader._table.segments) == 1  # the big shard is mapped, the rest in memory
