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
