"""Helpers to build tiny local models for tests and benchmarks; nothing is downloaded.

:func:`tiny_bpe_tokenizer` trains a byte-level BPE tokenizer on a handful of strings in milliseconds;
:func:`tiny_sentencepiece_tokenizer` a SentencePiece-style one (Llama-2, Mistral: a ``▁`` word-boundary prefix);
:func:`tiny_llama` builds a small, seeded, randomly initialised ``LlamaForCausalLM`` over its vocabulary. Greedy
outputs of an untrained model are gibberish but deterministic.

``transformers``, ``tokenizers`` and ``torch`` are imported inside the functions, so importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

CHATML_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def tiny_bpe_tokenizer(
    corpus: Sequence[str],
    vocab_size: int = 400,
    special_tokens: Sequence[str] = CHATML_SPECIAL_TOKENS,
    bos_token: str | None = "<|im_start|>",
    eos_token: str | None = "<|im_end|>",
    pad_token: str | None = "<|endoftext|>",
    chat_template: str | None = None,
    use_regex: bool = True,
    padding_side: str | None = None,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``corpus`` (no prefix space, the full byte alphabet).

    ``special_tokens`` take the first ids, in order. ``use_regex=False`` drops the GPT-2 pre-tokenization regex, so
    merges may cross word and punctuation boundaries. ``bos_token``, ``eos_token``, ``pad_token`` and
    ``padding_side`` are passed to the tokenizer only when given (``None``: the tokenizer's default).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(corpus, trainer)
    given = {"bos_token": bos_token, "eos_token": eos_token, "pad_token": pad_token, "padding_side": padding_side}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **{k: v for k, v in given.items() if v is not None})
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def tiny_sentencepiece_tokenizer(
    corpus: Sequence[str],
    vocab_size: int = 300,
    special_tokens: Sequence[str] = ("<unk>", "<s>", "</s>"),
) -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE tokenizer trained on ``corpus``, as Llama-2 and Mistral tokenize.

    Spaces become ``▁`` and a ``▁`` is prepended to the text (``"0.75"`` is written ``▁ 0 . 7 5`` or with ``▁0``),
    digits are split one per token, and unknown characters map to ``<unk>``. ``<s>`` is BOS, ``</s>`` EOS and pad.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    sp = Tokenizer(models.BPE(unk_token=special_tokens[0]))
    sp.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    sp.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens), show_progress=False)
    sp.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=sp,
        unk_token=special_tokens[0],
        bos_token=special_tokens[1],
        eos_token=special_tokens[2],
        pad_token=special_tokens[2],
    )


def tiny_llama(
    tokenizer: PreTrainedTokenizerBase,
    hidden_size: int = 32,
    intermediate_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 512,
    initializer_range: float | None = None,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A randomly initialised ``LlamaForCausalLM`` (tied embeddings) over ``tokenizer``'s vocabulary.

    The bos/eos/pad ids come from the tokenizer where it has those tokens; an id it lacks keeps ``LlamaConfig``'s
    default. ``initializer_range=None`` keeps the default (0.02, near-uniform next-token distributions; larger
    values give peaked, varied ones). ``torch.manual_seed(seed)`` is called right before construction, which
    therefore resets the global torch generator. The model is returned as constructed, in training mode.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    ids = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in ("bos", "eos", "pad")}
    extra: dict[str, Any] = {k: v for k, v in ids.items() if v is not None}
    if initializer_range is not None:
        extra["initializer_range"] = initializer_range
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        **extra,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def quiet_trainer(root: Any, **kwargs: Any) -> Any:
    """A CPU ``lightning.Trainer`` for tests: no logger, checkpoints, progress bar, summary or sanity check.

    Args:
        root: ``default_root_dir``.
        **kwargs: further ``Trainer`` arguments (``max_steps``, ``limit_val_batches``, ...).
    """
    import lightning as L

    defaults: dict[str, Any] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
    }
    return L.Trainer(default_root_dir=root, **{**defaults, **kwargs})
