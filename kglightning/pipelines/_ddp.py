"""Gathering a pipeline's per-question output rows from every DDP process."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def gather_unique_rows(rows: Sequence[dict[str, Any]], key: str = "id") -> list[dict[str, Any]]:
    """Every process's rows (under DDP; this process's otherwise), one per ``key``.

    A distributed sampler pads the ranks with repeated records, so the first row of each key is kept.
    """
    parts: list[Any] = [list(rows)]
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        parts = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(parts, list(rows))
    unique: dict[Any, dict[str, Any]] = {}
    for part in parts:
        for row in part:
            unique.setdefault(row[key], row)
    return list(unique.values())
