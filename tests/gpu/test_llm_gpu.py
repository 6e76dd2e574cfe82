"""The LLM pieces on a GPU: the local backend (device and dtype "auto"), KG-Trie decoding, the confidence readout, and
faiss grounding when faiss-gpu is installed."""

from __future__ import annotations

import math
import os

import pytest
import torch

ON_CPU = os.environ.get("KGLIGHTNING_GPU_TIER_ON_CPU") == "1"  # the dry run of tests/gpu/conftest.py


def test_local_backend_defaults_to_this_process_gpu_in_bf16(tiny_chat_model_dir, device):
    from kglightning.llm.backends import LocalHFBackend

    backend = LocalHFBackend(tiny_chat_model_dir, show_progress=False)
    expected = ("cpu", "float32") if ON_CPU else ("cuda:0", "bfloat16" if torch.cuda.is_bf16_supported() else "float16")
    assert (backend.resolved_device, backend.resolved_dtype) == expected
    conv = [[{"role": "user", "content": "capital of France?"}]] * 3
    greedy = backend.generate(conv, max_new_tokens=8, logprobs=True)
    assert backend.model.device.type == device.type
    assert len({g.text for g in greedy}) == 1 and all(math.isfinite(x) for x in greedy[0].token_logprobs or [0.0])
    sampled = backend.generate(conv, max_new_tokens=8, temperature=1.0, seed=3)
    assert sampled == backend.generate(conv, max_new_tokens=8, temperature=1.0, seed=3)  # seeded on the GPU too


def test_kg_trie_decoding_and_the_confidence_readout(tiny_chat_model_dir, capitals_dir, device, tmp_path):
    from transformers import LogitsProcessorList

    from kglightning.data.kg import KGIndex
    from kglightning.datamodules import ProxyGRPODataModule
    from kglightning.llm.lora import LoRASettings
    from kglightning.llm.trie import KGTrieLogitsProcessor, TrieConfig, path_validity
    from kglightning.modules import ProxySFT
    from kglightning.modules.proxy_sft import EvidenceGeneration

    dm = ProxyGRPODataModule(
        tokenizer=tiny_chat_model_dir, data_dir=capitals_dir, cache_dir=str(tmp_path / "cache"), batch_size=3,
        trie=TrieConfig(max_hops=2),
    )  # fmt: skip
    dm.setup("predict")
    batch = next(iter(dm.predict_dataloader()))
    proxy = ProxySFT(
        model=tiny_chat_model_dir, lora=LoRASettings(r=4, lora_alpha=8, lora_dropout=0.0),
        generation=EvidenceGeneration(num_evidence=2, max_new_tokens=24, confidence="expected"),
    ).to(device).eval()  # fmt: skip
    ids, mask = batch["input_ids"].to(device), batch["attention_mask"].to(device)
    texts, scores = proxy.generate_texts(ids, mask, tries=batch["tries"])
    assert len(texts) == 6 and scores is not None and all(math.isfinite(float(s)) for s in scores)
    # the random tiny model seldom opens a <PATH> block by itself: open one in the prompt, so that every sampled
    # continuation walks the trie on the GPU, and check each block against the question's own graph
    record = next(r for r in dm.read_split("test") if r.id == batch["id"][0])
    prompt = dm.tokenizer.decode(ids[0][mask[0].bool()]) + "<PATH confidence=0.5>"
    enc = dm.tokenizer([prompt] * 8, return_tensors="pt", add_special_tokens=False).to(device)
    torch.manual_seed(0)
    with torch.inference_mode():
        out = proxy.model.generate(
            **enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=96,
            logits_processor=LogitsProcessorList([KGTrieLogitsProcessor(batch["tries"][0])]),
            pad_token_id=dm.tokenizer.pad_token_id,
        )  # fmt: skip
    gens = dm.tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    validity = path_validity(["<PATH confidence=0.5>" + g for g in gens], KGIndex.from_triples(record.graph),
                             record.q_entity[0])  # fmt: skip
    assert validity.invalid == 0 and validity.valid >= 8, validity


@pytest.mark.skipif(ON_CPU, reason="faiss-gpu needs a GPU")
def test_faiss_grounding_on_the_gpu(tmp_path):
    pytest.importorskip("faiss", reason="faiss is not installed: KGLIGHTNING_FAISS=gpu bash tools/install.sh")
    from kglightning.data.embeddings import SentenceEncoder
    from kglightning.retrieval import FaissGrounder
    from kglightning.retrieval.faiss_grounding import faiss_gpu_available

    if not faiss_gpu_available():
        pytest.skip("faiss-gpu is not installed (the CPU build is): KGLIGHTNING_FAISS=gpu bash tools/install.sh")
    names = ["Barack Obama", "Paris", "Kenyan shilling", "Mount Kilimanjaro"]
    gpu = FaissGrounder(SentenceEncoder(show_progress=False), cache_dir=str(tmp_path), device="cuda")
    cpu = FaissGrounder(SentenceEncoder(show_progress=False), cache_dir=str(tmp_path), device="cpu")
    queries = ["Barak Obama", "Pariss", "banana bread"]
    on_gpu, on_cpu = gpu.nearest(queries, names), cpu.nearest(queries, names)
    assert [n for n, _ in on_gpu] == [n for n, _ in on_cpu]
    assert all(abs(a - b) < 1e-4 for (_, a), (_, b) in zip(on_gpu, on_cpu))
