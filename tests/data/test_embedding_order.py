"""The text embeddings do not depend on the order or the company a text is encoded in, beyond float16 rounding: a
cache warmed by another run holds the rows a cold run would compute."""

from __future__ import annotations

import random

import torch

from kglightning.data.embeddings import EmbeddingCache, SentenceEncoder


def test_rows_do_not_depend_on_batch_order_or_company(tiny_encoder_dir, tmp_path):
    words = ["Paris", "capital of France", "location.country.capital", "a much longer text about rivers and hills",
             "Nile", "people.person.nationality", "x", "the tallest mountain in the Alps, by elevation"]  # fmt: skip
    texts = [f"{w} {i}" for i, w in enumerate(words * 6)]
    alone = EmbeddingCache(SentenceEncoder(tiny_encoder_dir, batch_size=3, show_progress=False), root=None)
    alone.add(texts)
    shuffled = texts[:]
    random.Random(0).shuffle(shuffled)
    other = EmbeddingCache(SentenceEncoder(tiny_encoder_dir, batch_size=16, show_progress=False), root=None)
    other.add(shuffled[:20])  # another run warmed the cache with some of the texts, in other batches
    other.add(["an unrelated text that pads a batch", *shuffled[20:]])
    a = alone.rows(alone.ids(texts))
    b = other.rows(other.ids(texts))
    assert a.dtype == b.dtype == torch.float32  # handed out as float32 from float16 storage
    ulp = torch.finfo(torch.float16).eps * a.abs().clamp(min=2**-14)  # one float16 step at each value's size
    assert bool(((a - b).abs() <= ulp).all()), float((a - b).abs().max())


def test_encoding_on_several_processes_gives_the_vectors_of_one_beyond_float16_rounding(tiny_encoder_dir, monkeypatch):
    import datasets
    import pytest

    from kglightning.data.store import stage_map

    texts = [f"text {i} {'about rivers ' * (i % 5)}" for i in range(200)]
    one = SentenceEncoder(tiny_encoder_dir, batch_size=16, show_progress=False)
    many = SentenceEncoder(tiny_encoder_dir, batch_size=16, show_progress=False, num_proc=2)
    mapped, encode_mapped = [], SentenceEncoder._encode_mapped
    monkeypatch.setattr(
        SentenceEncoder, "_encode_mapped", lambda self, t: mapped.append(len(t)) or encode_mapped(self, t)
    )
    a, b = one.encode(texts), many.encode(texts)
    assert mapped == [200]  # the 200 strings went through the map
    assert a.shape == b.shape == (200, one.dim) and b.dtype == torch.float32
    ulp = torch.finfo(torch.float16).eps * a.abs().clamp(min=2**-14)
    assert bool(((a - b).abs() <= ulp).all()), float((a - b).abs().max())
    assert torch.equal(many.encode(texts[:5]), one.encode(texts[:5]))  # a small call: one process, one call

    def inside(batch):  # a map's function encodes in its own process (maps do not nest)
        return {"v": [many.encode(texts)[i].tolist() for i in batch["i"]]}

    ds = datasets.Dataset.from_dict({"i": [0, 199]})
    features = datasets.Features({"v": datasets.List(datasets.Value("float32"))})
    out = stage_map.cached_map(ds, inside, features, None, progress=False)
    assert torch.allclose(torch.tensor(out["v"]), a[[0, 199]], atol=1e-6)
    assert mapped == [200]  # neither the small call nor the calls inside a map started a map
    with pytest.raises(ValueError, match="num_proc"):
        SentenceEncoder(tiny_encoder_dir, num_proc=0)
    import kglightning.data.encoder as encoder_module

    as_device = SentenceEncoder(tiny_encoder_dir, batch_size=16, show_progress=False, num_proc=2, device="cpu:0")
    assert torch.allclose(as_device.encode(texts), a, atol=1e-6) and mapped == [200, 200]  # a CPU named otherwise
    monkeypatch.setattr(encoder_module, "can_fork", lambda: False)  # no fork: one process, its own threads
    assert torch.equal(many.encode(texts), a) and mapped == [200, 200]
