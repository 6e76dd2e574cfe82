"""Response and embedding caches miss when what produced their values changes: weights rewritten in place, an
adapter retrained, sampled batches, the structured-output mode (issue 26, item 6)."""

from __future__ import annotations

import os
import shutil

from kglightning.data.embeddings import EmbeddingCache, SentenceEncoder
from kglightning.llm.backends.base import GenerationParams
from kglightning.llm.backends.local_hf import LocalHFBackend
from kglightning.llm.backends.openai_http import OpenAIChatBackend


def _rewrite(path, data: bytes | None = None) -> None:
    """Rewrite a file in place (new content, a later modification time)."""
    st = os.stat(path)
    with open(path, "ab") as f:
        f.write(data or b"\0")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _weights(folder) -> str:
    return next(str(p) for p in sorted(folder.rglob("*.safetensors")))


def test_a_local_model_rewritten_in_place_misses_the_response_cache(tiny_chat_model_dir, tmp_path):
    folder = shutil.copytree(tiny_chat_model_dir, tmp_path / "model")
    before = LocalHFBackend(str(folder), device="cpu").cache_key
    assert LocalHFBackend(str(folder), device="cpu").cache_key == before  # nothing changed: the same key
    _rewrite(_weights(folder))
    assert LocalHFBackend(str(folder), device="cpu").cache_key != before


def test_a_retrained_adapter_misses_the_response_cache(tiny_chat_model_dir, tiny_sft_adapter, tmp_path):
    adapter = shutil.copytree(tiny_sft_adapter, tmp_path / "adapter")
    before = LocalHFBackend(tiny_chat_model_dir, adapter_path=str(adapter), device="cpu").cache_key
    _rewrite(adapter / "adapter_config.json", b" ")  # another rank or target modules, the same weight file
    assert LocalHFBackend(tiny_chat_model_dir, adapter_path=str(adapter), device="cpu").cache_key != before


def test_sampled_answers_are_keyed_by_batch_size_and_device_greedy_ones_are_not(tiny_chat_model_dir):
    greedy, sampled = GenerationParams(), GenerationParams(temperature=0.7)
    small = LocalHFBackend(tiny_chat_model_dir, batch_size=2, device="cpu")
    large = LocalHFBackend(tiny_chat_model_dir, batch_size=8, device="cpu")
    assert small.variant_key(greedy, False) == large.variant_key(greedy, False) == ""
    assert small.variant_key(sampled, False) == ":sampled-bs2-cpu" != large.variant_key(sampled, False)


def test_structured_output_mode_is_in_the_key_of_constrained_answers():
    vllm = OpenAIChatBackend("http://127.0.0.1:9/v1", model="m", structured_outputs="vllm", show_progress=False)
    legacy = OpenAIChatBackend(
        "http://127.0.0.1:9/v1", model="m", structured_outputs="vllm-legacy", show_progress=False
    )
    assert vllm.variant_key(GenerationParams(), True) != legacy.variant_key(GenerationParams(), True)
    assert vllm.variant_key(GenerationParams(), False) == legacy.variant_key(GenerationParams(), False) == ""


def test_an_encoder_retrained_into_the_same_folder_gets_new_embeddings(tiny_encoder_dir, tmp_path):
    folder = shutil.copytree(tiny_encoder_dir, tmp_path / "encoder")
    enc = SentenceEncoder(str(folder), show_progress=False)
    old = EmbeddingCache(enc, tmp_path / "emb").embed(["Paris"])
    # "retrain": new weights in the same folder (a scaled copy of the old ones)
    from safetensors.torch import load_file, save_file

    weights = _weights(folder)
    state = load_file(weights)
    save_file({k: v * 1.5 if v.is_floating_point() else v for k, v in state.items()}, weights)
    retrained = SentenceEncoder(str(folder), show_progress=False)
    assert retrained.cache_key != enc.cache_key
    new = EmbeddingCache(retrained, tmp_path / "emb").embed(["Paris"])
    assert not new.allclose(old, atol=1e-3)  # encoded by the new weights, not read back from the old table


def test_an_unreadable_embedding_shard_is_set_aside_and_its_texts_encoded_again(tiny_encoder_dir, tmp_path, caplog):
    import logging

    enc = SentenceEncoder(tiny_encoder_dir, show_progress=False)
    first = EmbeddingCache(enc, tmp_path / "emb").embed(["Paris", "Lyon"])
    (shard,) = (tmp_path / "emb").rglob("shard-*.arrow")
    shard.write_bytes(b"torn")
    with caplog.at_level(logging.WARNING):
        again = EmbeddingCache(enc, tmp_path / "emb").embed(["Paris", "Lyon"])
    assert "cannot be read" in caplog.text and again.allclose(first, atol=1e-2)  # float16 in the shards
    assert shard.with_name(shard.name + ".unreadable").exists()
    assert len(EmbeddingCache(enc, tmp_path / "emb")) == 2  # the new shard is read back, the bad one no more


def test_a_shard_that_cannot_be_opened_now_is_skipped_not_set_aside(tiny_encoder_dir, tmp_path, monkeypatch):
    import errno

    import kglightning.data.embeddings as embeddings

    enc = SentenceEncoder(tiny_encoder_dir, show_progress=False)
    EmbeddingCache(enc, tmp_path / "emb").embed(["Paris"])
    (shard,) = (tmp_path / "emb").rglob("shard-*.arrow")

    def too_many_files(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(embeddings, "read_shard", too_many_files)
    assert len(EmbeddingCache(enc, tmp_path / "emb")) == 0  # skipped in this process
    monkeypatch.undo()
    assert shard.exists() and len(EmbeddingCache(enc, tmp_path / "emb")) == 1  # the good file stays for the next
