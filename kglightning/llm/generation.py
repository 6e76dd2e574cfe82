"""``generate`` with exactly the settings it is given, whatever the checkpoint's ``generation_config`` says.

``transformers`` fills every field a ``GenerationConfig`` leaves unset from the model's own ``generation_config``
(a checkpoint's sampling defaults: ``repetition_penalty`` 1.05 on Qwen2.5-Instruct, ``temperature``, ``top_k``,
``do_sample``...), and in 4.5x even fields set to their default value were overwritten. A greedy validation then
samples, and GRPO's rollouts come from another distribution than the log-probabilities it optimises.
:func:`generate_exactly` runs ``model.generate`` while the model's ``generation_config`` holds only its special-token
ids (:func:`plain_generation_config`), so the call's own settings are the only ones.

Example:
    >>> from transformers import GenerationConfig
    >>> plain = plain_generation_config(GenerationConfig(repetition_penalty=1.05, top_k=20, eos_token_id=2))
    >>> plain.repetition_penalty, plain.top_k, plain.eos_token_id
    (None, None, 2)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["SPECIAL_TOKEN_FIELDS", "generate_exactly", "plain_generation_config", "settings_only"]

SPECIAL_TOKEN_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
"""The fields of a checkpoint's generation config that are kept: they name tokens, they choose none."""


def plain_generation_config(config: Any, **overrides: Any) -> Any:
    """A ``GenerationConfig`` with only the special-token ids of ``config`` (and ``overrides``)."""
    from transformers import GenerationConfig

    kept = {name: getattr(config, name, None) for name in SPECIAL_TOKEN_FIELDS}
    kept.update(overrides)
    return GenerationConfig(**{k: v for k, v in kept.items() if v is not None})


def _generating_model(model: Any) -> Any:
    """The ``transformers`` model whose ``generation_config`` ``generate`` reads (the base model under PEFT)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base


@contextmanager
def settings_only(model: Any) -> Iterator[None]:
    """While inside, ``model.generate`` sees a plain generation config (restored on exit)."""
    target = _generating_model(model)
    saved = getattr(target, "generation_config", None)
    if saved is None:
        yield
        return
    target.generation_config = plain_generation_config(saved)
    try:
        yield
    finally:
        target.generation_config = saved


def generate_exactly(model: Any, **kwargs: Any) -> Any:
    """``model.generate(**kwargs)`` with no setting taken from the model's ``generation_config``.

    Args:
        model: a ``transformers`` causal LM, or a PEFT model around one.
        **kwargs: ``generate``'s arguments; pass every setting the call depends on in ``generation_config``.
    """
    with settings_only(model):
        return model.generate(**kwargs)
