"""faiss grounding with the bundled MiniLM (site-packages, no download): near-miss spellings, the floor, the counts."""

from __future__ import annotations

import pytest
import torch

from kglightning.data.embeddings import SentenceEncoder
from kglightning.llm.grounding import ground_answers
from kglightning.retrieval import FaissGrounder

NAMES = ["Barack Obama", "Paris", "Kenyan shilling", "United States of America", "Mount Kilimanjaro", "Swahili"]


@pytest.fixture(scope="module")
def grounder(tmp_path_factory):
    cache = tmp_path_factory.mktemp("emb")
    return FaissGrounder(SentenceEncoder(show_progress=False), cache_dir=str(cache), min_similarity=0.8, device="cpu")


def test_near_miss_spellings_ground_and_far_answers_do_not(grounder):
    exact = ground_answers({"Barak Obama": 0.9, "Pariss": 0.6, "Swahili": 0.5, "Mars": 0.2}, NAMES)
    assert set(exact.unmatched) == {"Barak Obama", "Pariss", "Mars"}
    out = grounder.ground(exact, NAMES)
    assert out.entities == {"Swahili": 0.5, "Barack Obama": 0.9, "Paris": 0.6}
    assert out.unmatched == {"Mars": 0.2}  # nearest name is far below the floor
    assert (grounder.matched, grounder.unmatched) == (2, 1)


def test_nearest_equals_brute_force_cosine(grounder):
    queries = ["Barak Obama", "Kenya Shilling", "USA", "Kiswahili", "banana bread"]
    got = grounder.nearest(queries, NAMES)
    q, n = grounder.embeddings.embed(queries), grounder.embeddings.embed(NAMES)
    sims = torch.nn.functional.normalize(q, dim=1) @ torch.nn.functional.normalize(n, dim=1).T
    best = sims.max(dim=1)
    for (name, sim), value, idx in zip(got, best.values.tolist(), best.indices.tolist()):
        assert sim == pytest.approx(value, abs=1e-5)
        assert name == (NAMES[idx] if value >= 0.8 else None)


def test_entity_ids_empty_inputs_and_arguments(grounder):
    ids = {"m.01": "Barack Obama", "m.02": "Paris"}
    out = grounder.ground(ground_answers({"Barak Obama": None}, ids), ids)
    assert out.entities == {"m.01": None}
    assert grounder.nearest([], NAMES) == [] and grounder.nearest(["x"], [])[0][0] is None
    with pytest.raises(ValueError, match="min_similarity"):
        FaissGrounder(min_similarity=2.0)
    with pytest.raises(ValueError, match="device"):
        FaissGrounder(device="tpu")


def test_on_a_gpu_the_index_goes_to_this_process_gpu(grounder, monkeypatch):
    """Under DDP each process moves its index to its own GPU (LOCAL_RANK), not GPU 0. faiss-cpu has no GPU calls, so
    the two faiss-gpu entry points are stood in for by recorders that keep the CPU index."""
    import faiss

    from kglightning.retrieval import faiss_grounding

    moved_to = []

    def to_gpu(resources, device, index):
        moved_to.append(device)
        return index

    monkeypatch.setattr(faiss, "StandardGpuResources", object, raising=False)
    monkeypatch.setattr(faiss, "index_cpu_to_gpu", to_gpu, raising=False)
    monkeypatch.setattr(faiss_grounding, "faiss_gpu_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    gpu = FaissGrounder(grounder.encoder, cache_dir=grounder.cache_dir, min_similarity=0.8, device="auto")
    assert gpu.nearest(["Barak Obama"], NAMES)[0][0] == "Barack Obama"
    assert moved_to == [1]
