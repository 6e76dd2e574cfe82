"""Helpers for values gathered from several processes."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["unique_by_key"]


def unique_by_key(keys: Tensor) -> Tensor:
    """Indices of the first item of each distinct key, in increasing key order.

    A distributed sampler pads the last shard with repeated items, so scores gathered from every process hold some
    items twice; indexing them with ``unique_by_key(item_keys)`` keeps each item once, in an order that does not
    depend on the number of processes.

    Args:
        keys: ``(N,)`` integer item keys.

    Returns:
        ``(K,)`` long indices into ``keys``, one per distinct key.

    Example:
        >>> unique_by_key(torch.tensor([7, 3, 7, 5, 3]))
        tensor([1, 3, 0])
    """
    if keys.dim() != 1:
        raise ValueError(f"keys must be 1-D, got shape {tuple(keys.shape)}")
    distinct, inverse = torch.unique(keys, return_inverse=True)
    positions = torch.arange(keys.numel(), device=keys.device)
    first = torch.full((distinct.numel(),), keys.numel(), dtype=torch.long, device=keys.device)
    return first.scatter_reduce(0, inverse, positions, reduce="amin")
