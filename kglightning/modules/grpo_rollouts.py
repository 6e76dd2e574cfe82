"""GRPO rollouts as plain data, and how reward functions with TRL's signature score them."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = ["RewardFunc", "Rollouts", "reward_name", "score_completions"]

RewardFunc = Callable[..., Sequence[float | None]]
"""A reward function with TRL's signature: ``f(prompts=, completions=, completion_ids=, **columns)``."""

TENSOR_KEYS = ("input_ids", "attention_mask", "tries")
"""Batch entries that are not per-prompt columns for the reward functions."""


@dataclass
class Rollouts:
    """A batch's completions with their rewards, ``N = B * G`` rows in group order.

    Attributes:
        input_ids: ``(N, P + T)`` prompt (left-padded) and completion ids.
        attention_mask: ``(N, P + T)``.
        mask: ``(N, T)`` 1 on completion tokens up to and including the first EOS.
        per_func: ``(N, F)`` rewards per reward function (NaN: unscored).
        rewards: ``(N,)`` weighted sums (NaN: no function scored the completion).
        texts: the decoded completions.
    """

    input_ids: Tensor
    attention_mask: Tensor
    mask: Tensor
    per_func: Tensor
    rewards: Tensor
    texts: list[str]


def reward_name(func: Any) -> str:
    """The name a reward function's mean is logged under (``__name__``, else its class name)."""
    return str(getattr(func, "__name__", type(func).__name__))


def score_completions(
    funcs: Sequence[RewardFunc],
    names: Sequence[str],
    prompts: Sequence[str],
    completions: Sequence[str],
    completion_ids: Sequence[Sequence[int]],
    batch: dict[str, Any],
) -> list[list[float]]:
    """``N`` rows of ``F`` rewards (NaN where a function gave None or a non-finite value).

    ``batch``'s list columns (one value per prompt) are repeated to one value per completion, as TRL passes dataset
    columns.

    Example:
        >>> def length(completions, **kwargs):
        ...     return [float(len(c)) if c else None for c in completions]
        >>> score_completions([length], ["length"], ["p"], ["ab", ""], [[1, 2], []], {"id": ["q"]})
        [[2.0], [nan]]
    """
    n = len(completions)
    per = n // max(len(prompts), 1)
    columns = {
        k: [v for v in values for _ in range(per)]
        for k, values in batch.items()
        if k not in TENSOR_KEYS and isinstance(values, list)
    }
    out = [[math.nan] * len(funcs) for _ in range(n)]
    if n == 0:
        return out
    for j, (func, name) in enumerate(zip(funcs, names)):
        values = list(
            func(
                prompts=[p for p in prompts for _ in range(per)],
                completions=list(completions),
                completion_ids=[list(c) for c in completion_ids],
                **columns,
            )
        )
        if len(values) != n:
            raise ValueError(f"reward function {name!r} returned {len(values)} rewards for {n} completions")
        for i, v in enumerate(values):
            if v is not None and math.isfinite(float(v)):
                out[i][j] = float(v)
    return out
