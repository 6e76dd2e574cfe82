"""ProxyEvidenceCache: a question's key changes with everything that decides the proxy's evidence."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kglightning.data.records import KGQARecord
from kglightning.llm.trie import TrieConfig
from kglightning.pipelines.evidence_cache import ProxyEvidenceCache, proxy_identity


def proxy(seed: int = 0, max_new_tokens: int = 48):
    torch.manual_seed(seed)
    return SimpleNamespace(
        hparams={"model": "/nonexistent/model", "gguf_file": None, "dtype": "float32"},
        model=torch.nn.Linear(3, 2),
        generation={"num_evidence": 3, "max_new_tokens": max_new_tokens},
        prompt_format={"style": "chat"},
    )


def record(graph=(("France", "capital", "Paris"),), question="capital of France?"):
    return KGQARecord("q", question, ["Paris"], ["France"], ["Paris"], [tuple(t) for t in graph])


def test_the_key_follows_weights_settings_and_graph(tmp_path):
    base = proxy_identity(proxy(), TrieConfig())
    assert base == proxy_identity(proxy(), TrieConfig())
    assert base != proxy_identity(proxy(seed=1), TrieConfig())  # another adapter
    assert base != proxy_identity(proxy(max_new_tokens=8), TrieConfig())
    assert base != proxy_identity(proxy(), TrieConfig(max_hops=2)) != proxy_identity(proxy(), None)
    frozen = proxy()
    frozen.model.weight.requires_grad_(False)  # only trainable (adapter) weights are hashed
    with torch.no_grad():
        frozen.model.weight.add_(1.0)
    assert proxy_identity(frozen, None) == proxy_identity(_frozen_copy(), None)

    with_trie = ProxyEvidenceCache(str(tmp_path / "a"), base, uses_graph=True)
    other_graph = record(graph=(("France", "capital", "Lyon"),))
    assert with_trie.key(record()) != with_trie.key(other_graph) and with_trie.key(record()) == with_trie.key(record())
    no_trie = ProxyEvidenceCache(str(tmp_path / "b"), base, uses_graph=False)
    assert no_trie.key(record()) == no_trie.key(other_graph) != no_trie.key(record(question="capital of Peru?"))


def _frozen_copy():
    p = proxy()
    p.model.weight.requires_grad_(False)
    return p


def test_texts_round_trip_and_count_hits(tmp_path):
    cache = ProxyEvidenceCache(str(tmp_path), "k", uses_graph=True)
    assert cache.get(record()) is None
    cache.put(record(), ["<PATH>capital</PATH>", ""])
    again = ProxyEvidenceCache(str(tmp_path), "k", uses_graph=True)
    assert again.get(record()) == ["<PATH>capital</PATH>", ""] and again.hits == 1
    assert ProxyEvidenceCache(str(tmp_path), "other proxy", uses_graph=True).get(record()) is None
