"""generate uses exactly the settings it is given: a checkpoint's own generation config changes nothing."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from kglightning.llm.generation import generate_exactly, plain_generation_config, settings_only

pytestmark = pytest.mark.usefixtures("single_torch_thread")

#: what a checkpoint may ship (Qwen2.5-Instruct ships repetition_penalty 1.05, temperature 0.7, top_k 20...)
POLLUTED = {"repetition_penalty": 5.0, "no_repeat_ngram_size": 1, "temperature": 0.3, "top_k": 2, "do_sample": True}


def _pollute(model, suppress: list[int] | None = None):
    """Give ``model`` a checkpoint's sampling defaults; ``suppress``: token ids it bans (a field that is unset,
    ``None``, in every config a caller writes, so only the model's own config can set it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    gc = base.generation_config
    base.generation_config = GenerationConfig(
        **POLLUTED, suppress_tokens=suppress, eos_token_id=gc.eos_token_id, pad_token_id=gc.pad_token_id
    )


def _manual_greedy(model, ids: torch.Tensor, steps: int, eos: int) -> list[int]:
    out = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(input_ids=ids).logits[0, -1].argmax())
            out.append(nxt)
            if nxt == eos:
                break
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return out


def test_plain_config_and_the_context_restore_the_model_config(tiny_chat_model_dir):
    from kglightning.llm.backends.local_hf import load_causal_lm

    model = load_causal_lm(tiny_chat_model_dir)
    _pollute(model)
    polluted = model.generation_config
    with settings_only(model):
        assert model.generation_config.repetition_penalty is None and model.generation_config.eos_token_id is not None
    assert model.generation_config is polluted
    plain = plain_generation_config(polluted, pad_token_id=7)
    assert plain.to_diff_dict().keys() <= {"eos_token_id", "pad_token_id", "transformers_version"}


def test_greedy_stays_greedy_under_a_checkpoint_that_samples(tiny_chat_model_dir):
    from kglightning.llm.backends.local_hf import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm(tiny_chat_model_dir).eval(), load_tokenizer(tiny_chat_model_dir)
    ids = torch.tensor([tok("what is the capital of Peru?")["input_ids"]])
    expected = _manual_greedy(model, ids, 12, tok.eos_token_id)
    _pollute(model, suppress=expected[:1])
    config = GenerationConfig(max_new_tokens=12, do_sample=False, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    got = generate_exactly(model, input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    assert got[0, ids.shape[1] :].tolist()[: len(expected)] == expected
    torch.manual_seed(0)
    leaky = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
    assert leaky[0, ids.shape[1] :].tolist() != expected  # what a plain generate does with this checkpoint


def test_proxy_and_backend_decode_greedily_under_a_checkpoint_that_samples(tiny_chat_model_dir, make_conversations):
    from kglightning.llm.backends import LocalHFBackend
    from kglightning.llm.lora import LoRASettings
    from kglightning.modules import ProxySFT

    proxy = ProxySFT(model=tiny_chat_model_dir, lora=LoRASettings(r=4, lora_alpha=8, lora_dropout=0.0))
    tok = proxy.tokenizer
    ids = torch.tensor([tok("capital of Peru?")["input_ids"]])
    proxy.model.eval()
    expected = _manual_greedy(proxy.model, ids, proxy.max_new_tokens, tok.eos_token_id)
    _pollute(proxy.model, suppress=expected[:1])
    texts, _ = proxy.generate_texts(ids, torch.ones_like(ids), "greedy")
    assert texts[0] == tok.decode(expected, skip_special_tokens=True)

    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=1, show_progress=False)
    conv = make_conversations(1)[0]
    clean = backend.generate([conv], max_new_tokens=10)[0]
    first = backend.tokenizer(clean.text, add_special_tokens=False)["input_ids"][:1]
    _pollute(backend.model, suppress=first)
    assert backend.generate([conv], max_new_tokens=10)[0].text == clean.text
