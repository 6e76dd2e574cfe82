"""Fixtures for the LLM backend tests: a tiny random chat model built locally (nothing downloaded).

The tokenizer is a byte-level BPE trained in a few milliseconds on a handful of sentences, with ChatML special
tokens and a ChatML chat template (the format of SmolLM2-Instruct). The model is a 2-layer, 32-wide Llama with
seeded random weights, so greedy outputs are gibberish but deterministic and varied.
"""

from __future__ import annotations

import pytest

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "what is the capital of France? Paris is the capital of France.",
    "which languages are spoken in Peru? Spanish and Quechua are spoken in Peru.",
    "You are a helpful assistant. Answer the question using the knowledge graph paths.",
    "system user assistant confidence evidence relation path answer",
    "The currency of Japan is the yen; the currency of Kenya is the shilling.",
]


@pytest.fixture(scope="session")
def tiny_chat_model_dir(tmp_path_factory) -> str:
    """A folder with a tiny random ``LlamaForCausalLM`` and a ChatML byte-level BPE tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tiny_chat_model")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(CORPUS * 4, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(root)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        initializer_range=0.5,  # peaked, varied next-token distributions (the default 0.02 is near uniform)
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(root)
    return str(root)


@pytest.fixture
def single_torch_thread():
    """Run a test with one intra-op torch thread, restored afterwards.

    Tiny models gain nothing from intra-op parallelism, and on a busy 2-core machine spinning OpenMP threads made
    the same tests up to 50x slower.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_backend(tiny_chat_model_dir):
    """A loaded :class:`LocalHFBackend` over the tiny model (shared: loading is the slow part)."""
    from kglightning.llm.backends.local_hf import LocalHFBackend

    backend = LocalHFBackend(tiny_chat_model_dir, batch_size=4, show_progress=False)
    backend.load()
    return backend


def _conversations(n: int) -> list[list[dict[str, str]]]:
    out = []
    for i in range(n):
        msgs = [{"role": "user", "content": f"question {i}: what is the capital of " + "France " * (i % 4)}]
        if i % 3 == 0:
            msgs.insert(0, {"role": "system", "content": "You are a helpful assistant."})
        out.append(msgs)
    return out


@pytest.fixture(scope="session")
def make_conversations():
    """``make_conversations(n)``: ``n`` distinct short conversations of varying length (batches need padding)."""
    return _conversations
