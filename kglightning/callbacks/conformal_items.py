"""Helpers of :class:`~kglightning.callbacks.ConformalCallback`: gathering per-item columns across DDP processes,
one calibration score per exchangeable unit, writing sets into ``predict`` outputs, and keeping the callback ahead
of the prediction writers."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, Callback
from torch import Tensor

from kglightning.conformal.functional import unit_scores
from kglightning.data.devices import all_gather_objects
from kglightning.metrics.functional import unique_by_key

log = logging.getLogger("kglightning.callbacks.conformal")  # the callback's logger: its warnings are the callback's


def per_unit_scores(
    scores: Tensor, units: Tensor, per_unit: Literal["one", "every"], seed: int, keys: Tensor | None = None
) -> Tensor:
    """One calibration score per unit (:func:`~kglightning.conformal.functional.unit_scores`), the same whatever
    the order the items arrive in when they have ``keys`` (they are put in key order first).

    The draws of ``"one"`` come from a generator seeded by ``seed`` and a digest of the scores and units, so that
    one seed gives fresh draws for fresh calibration data (a draw fixed by the seed alone would pick the same
    positions of every unit on every data set) and the same draws for the same data.
    """
    s, u = scores.detach().double().flatten().cpu(), units.detach().long().flatten().cpu()
    if keys is not None:
        order = torch.argsort(keys.detach().long().flatten().cpu(), stable=True)
        s, u = s[order], u[order]
    digest = hashlib.blake2b(str(seed).encode(), digest_size=8)
    digest.update(s.numpy().tobytes())
    digest.update(u.numpy().tobytes())
    generator = torch.Generator().manual_seed(int.from_bytes(digest.digest(), "big") >> 1)
    return unit_scores(s, u, per_unit, generator)


def unit_coverage(hit: Tensor, units: Tensor, per_unit: Literal["one", "every"]) -> float:
    """The coverage the unit-level threshold promises: the mean over units of the share of their items covered
    (``"one"``) or of whether every item is covered (``"every"``).

    Example:
        >>> hit, units = torch.tensor([True, False, True, True]), torch.tensor([0, 0, 0, 1])
        >>> round(unit_coverage(hit, units, "one"), 4), unit_coverage(hit, units, "every")
        (0.8333, 0.5)
    """
    _, inverse = torch.unique(units.long().cpu(), return_inverse=True)
    n = int(inverse.max()) + 1 if inverse.numel() else 0
    size = torch.zeros(n, dtype=torch.float64, device="cpu").scatter_add_(
        0, inverse, torch.ones_like(hit, dtype=torch.float64)
    )
    got = torch.zeros(n, dtype=torch.float64, device="cpu").scatter_add_(0, inverse, hit.double().cpu())
    share = got / size.clamp(min=1)
    return float((share if per_unit == "one" else (got == size).double()).mean()) if n else math.nan


def check_scorer(pl_module: L.LightningModule) -> None:
    if not callable(getattr(pl_module, "conformal_scores", None)):
        raise TypeError(
            f"{type(pl_module).__name__} does not implement conformal_scores(batch) -> ConformalScores, which "
            "ConformalCallback needs (see kglightning.callbacks.conformal.ConformalScorer)"
        )


def val_loaders(trainer: L.Trainer | None) -> list[Iterable]:
    """The validation loaders of ``trainer``'s datamodule, else of the trainer."""
    if trainer is None:
        raise ValueError("pass a dataloader, or a trainer whose datamodule has a val_dataloader")
    dm = trainer.datamodule
    if dm is not None and callable(getattr(dm, "val_dataloader", None)):
        loaders = dm.val_dataloader()
    else:
        loaders = trainer.val_dataloaders
    if loaders is None:
        raise ValueError("no validation dataloader to calibrate on; pass one to ConformalCallback.fit")
    return list(loaders) if isinstance(loaders, (list, tuple)) else [loaders]


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


#: one batch's unlabelled items: their count, keys and unit ids (``None`` when the module gives none)
LeftOut = tuple[int, Tensor | None, Tensor | None]


def labelled_scores(pl_module: Any, batch: Any, loader: int, left_out: list[LeftOut]) -> Any:
    """The batch's :class:`~kglightning.conformal.scorer.ConformalScores` restricted to its labelled items; the
    unlabelled ones (``ConformalScores.labelled`` false) are recorded in ``left_out`` for :func:`log_left_out`."""
    cs = pl_module.conformal_scores(batch)
    if cs.labelled is not None and not bool(cs.labelled.all()):
        miss = ~cs.labelled.detach().bool().cpu()
        keys, units = offset(cs.keys, loader), offset(cs.units, loader)
        left_out.append((int(miss.sum()), None if keys is None else keys[miss], None if units is None else units[miss]))
    return cs.labelled_part()


def log_left_out(left_out: list[LeftOut], gather: bool = False) -> tuple[int, int | None]:
    """Log, once, how many unlabelled items (and units) calibration left out; return ``(items, units)`` (``units``
    ``None`` when the module gives none). Items are counted once per key when every batch has keys (the repeats a
    distributed sampler pads a shard with count once). With ``gather``, every process's records are gathered first
    (every process must call it then)."""
    parts = [p for rank in all_gather_objects(left_out) for p in rank] if gather else left_out
    if not parts:
        return 0, None
    keys = [k for _, k, _ in parts]
    items = (
        int(torch.unique(torch.cat(keys)).numel()) if all(k is not None for k in keys) else sum(n for n, _, _ in parts)
    )
    unit_ids = [u for _, _, u in parts]
    units = int(torch.unique(torch.cat(unit_ids)).numel()) if all(u is not None for u in unit_ids) else None
    log.warning(
        "ConformalCallback: left %d unlabelled items%s out of calibration (ConformalScores.labelled is false for them, "
        "e.g. the answers of a question without gold answers): the threshold holds for items drawn like the "
        "labelled ones", items, "" if units is None else f" ({units} units)",
    )  # fmt: skip
    return items, units


def offset(t: Tensor | None, loader: int) -> Tensor | None:
    """Item keys or unit ids of one loader made distinct across loaders (the loader's index in the top bits)."""
    return None if t is None else t.detach().long().cpu() + (loader << 48)


def unit_column(cs: Any, loader: int) -> Tensor:
    """The ``(N,)`` unit ids of a batch's :class:`~kglightning.conformal.scorer.ConformalScores` made distinct
    across loaders (:func:`offset`), or ``-1`` for each item when the module gives none (so that every process
    gathers the same columns)."""
    if cs.units is None:
        return torch.full((cs.scores.shape[0],), -1, dtype=torch.long, device="cpu")
    return offset(cs.units, loader)  # type: ignore[return-value]


def gathered_units(units: Tensor) -> Tensor | None:
    """Gathered unit ids (:func:`unit_column`), or ``None`` when no batch named units; a mix is an error."""
    given = units >= 0
    if not bool(given.any()):
        return None
    if not bool(given.all()):
        raise ValueError(
            f"conformal_scores(batch) gave ConformalScores.units for {int(given.sum())} of {units.numel()} items; "
            "give them for every batch or for none"
        )
    return units


def all_or_none(parts: list[Tensor | None], name: str, required: bool = True) -> Tensor | None:
    """``parts`` concatenated when every batch gave them, ``None`` when none did; a mix is an error for ``units``
    (``required``): calibrating on items where some batches name units would count the items of a unit as
    independent without a word."""
    given = [p for p in parts if p is not None]
    if not given or (len(given) < len(parts) and not required):
        return None
    if len(given) < len(parts):
        raise ValueError(
            f"conformal_scores(batch) gave ConformalScores.{name} for {len(given)} of {len(parts)} batches; give them "
            "for every batch or for none"
        )
    return torch.cat(given)
