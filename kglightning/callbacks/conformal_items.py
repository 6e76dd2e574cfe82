"""Helpers of :class:`~kglightning.callbacks.ConformalCallback`: gathering per-item columns across DDP processes,
writing sets into ``predict`` outputs, and keeping the callback ahead of the prediction writers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.callbacks import BasePredictionWriter, Callback
from torch import Tensor

from kglightning.data.devices import all_gather_objects
from kglightning.metrics.functional import unique_by_key


def _gather_items(
    columns: Sequence[list[Tensor]], keys: list[Tensor | None], dtypes: Sequence[torch.dtype]
) -> tuple[list[Tensor], bool]:
    """Every process's per-item columns (lists of CPU batch tensors, empty lists allowed), each concatenated, with
    one entry per item key when every batch of every process has keys (the repeats a distributed sampler pads the
    last shard with are dropped); and whether they all had keys. Every process must call it.

    Objects, not tensors, are gathered: the shards differ in length, and none of these tensors is on the device.
    """
    local = [torch.cat(c) if c else torch.zeros(0, dtype=d, device="cpu") for c, d in zip(columns, dtypes)]
    keyed = all(k is not None for k in keys)
    local_keys = (torch.cat(keys) if keys else torch.zeros(0, dtype=torch.long, device="cpu")) if keyed else None
    parts = all_gather_objects((local, local_keys))
    out = [torch.cat([p[0][i] for p in parts]) for i in range(len(local))]
    keyed = all(p[1] is not None for p in parts)
    if keyed:
        keep = unique_by_key(torch.cat([p[1] for p in parts]))
        out = [c[keep] for c in out]
    return out, keyed


def attach_sets(outputs: Any, sets: list[list[Any]], qhat: float | list[float]) -> None:
    """Write sets into ``predict_step`` outputs: a list of one dict per item, or one dict for the batch. ``qhat`` is
    one threshold, or one per item (groups)."""
    per_item = qhat if isinstance(qhat, list) else [qhat] * len(sets)
    if isinstance(outputs, dict):
        full = [math.isinf(q) for q in per_item] if isinstance(qhat, list) else math.isinf(qhat)
        outputs.update(conformal_set=sets, conformal_qhat=qhat, conformal_full_set=full)
    elif isinstance(outputs, list) and len(outputs) == len(sets) and all(isinstance(o, dict) for o in outputs):
        for out, s, q in zip(outputs, sets, per_item):
            out.update(conformal_set=s, conformal_qhat=q, conformal_full_set=math.isinf(q))
    else:
        raise TypeError(
            "ConformalCallback cannot place the sets in these predict outputs (a dict, or a list of one dict per "
            "item, is expected); implement attach_conformal_sets(outputs, batch, sets, qhat) on the module"
        )


def ahead_of_writers(callback: Callback, callbacks: list[Callback]) -> list[Callback]:
    """``callbacks`` with ``callback`` moved just before the first prediction writer that precedes it.

    Lightning calls ``on_predict_batch_end`` in list order, so a :class:`BasePredictionWriter` listed earlier would
    write a batch before ``callback`` adds its sets. Returns ``callbacks`` itself when nothing has to move, else a
    new list in which every other callback keeps its order.

    Example:
        >>> from lightning.pytorch.callbacks import BasePredictionWriter, Callback
        >>> a, w, c = Callback(), BasePredictionWriter(), Callback()
        >>> ahead_of_writers(c, [a, w, c]) == [a, c, w]
        True
    """
    late = _writers_before(callback, callbacks)
    if not late:
        return callbacks
    out = [cb for cb in callbacks if cb is not callback]
    out.insert(next(i for i, cb in enumerate(out) if cb is late[0]), callback)
    return out


def _writers_before(callback: Callback, callbacks: list[Callback]) -> list[Callback]:
    index = next((i for i, cb in enumerate(callbacks) if cb is callback), 0)
    return [cb for cb in callbacks[:index] if isinstance(cb, BasePredictionWriter)]
