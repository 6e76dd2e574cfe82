"""Gathering a pipeline's per-question output rows and its counters from every DDP process."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kglightning.data.devices import all_gather_objects


def gather_unique_rows(rows: Sequence[dict[str, Any]], key: str = "id") -> list[dict[str, Any]]:
    """Every process's rows (under DDP; this process's otherwise), one per ``key``.

    A distributed sampler pads the ranks with repeated records, so the first row of each key is kept.
    """
    parts = all_gather_objects(list(rows))
    unique: dict[Any, dict[str, Any]] = {}
    for part in parts:
        for row in part:
            unique.setdefault(row[key], row)
    return list(unique.values())


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return {k: _add(a[k], b[k]) if k in a and k in b else a.get(k, b.get(k)) for k in {**a, **b}}
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a + b
    if isinstance(a, list) and isinstance(b, list):
        return a + b
    return a


def sum_over_ranks(counts: Mapping[str, Any]) -> dict[str, Any]:
    """Every process's counters added up under DDP (a copy of this process's otherwise); every process must call it.

    Numbers are summed, mappings key by key (a key one process lacks is taken from the others), lists concatenated;
    any other value comes from the lowest rank that has it. For a predict run, whose sampler repeats no record, the
    sums count each question once.

    Example:
        >>> sum_over_ranks({"questions": 3, "cost": {"seconds": 1.5}})  # one process
        {'questions': 3, 'cost': {'seconds': 1.5}}
    """
    parts = all_gather_objects(dict(counts))
    total: Any = parts[0]
    for part in parts[1:]:
        total = _add(total, part)
    return dict(total)
