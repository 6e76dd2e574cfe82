"""What a model hands to split-conformal calibration: per-item, per-candidate non-conformity scores.

:class:`ConformalScores` holds the scores of a batch (with gold labels and a padding mask); :class:`ConformalScorer`
is the protocol a LightningModule implements to work with :class:`~kglightning.callbacks.ConformalCallback`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import Tensor

from kglightning.conformal.functional import prediction_sets

__all__ = ["ConformalScorer", "ConformalScores"]


@dataclass
class ConformalScores:
    """Non-conformity scores of a batch: ``N`` items, each with up to ``C`` candidates.

    Args:
        scores: ``(N, C)`` float non-conformity, lower = more conforming (e.g. ``1 - p(candidate)``).
        labels: ``(N, C)`` bool, ``True`` for the true candidates; ``None`` when unknown (plain ``predict``).
        mask: ``(N, C)`` bool, ``True`` for real candidates (``False`` = padding); ``None`` = all real.
        candidates: names of the ``C`` candidates when every item shares them (e.g. class names); sets are then
            reported by name, otherwise by candidate index.
        keys: ``(N,)`` integer keys in ``[0, 2**48)`` that name the items of a loader across processes (e.g. the
            item's index in its split);
            under DDP the calibration keeps one score per key, so the repeats a distributed sampler pads the last
            shard with do not enter the quantile. ``None``: no keys (the repeats then count).
        groups: ``(N,)`` integer group ids for Mondrian calibration (``ConformalCallback(by_group=True)`` fits one
            ``qhat`` per group), e.g. grounded or not; ``None``: one group.
        group_names: the names of the group ids (``group_names[i]`` names id ``i``), for logs and metric names.
        units: ``(N,)`` integer ids in ``[0, 2**48)`` of the exchangeable unit each item belongs to, unique within a
            loader (e.g. the index of an answer's question in its split): when items cluster (the answers of one
            question depend on each other), ``ConformalCallback`` calibrates on one score per unit and counts units,
            not items. ``None``: every item is its own unit (items exchangeable).
        labelled: ``(N,)`` bool, ``False`` for an item whose ``labels`` say nothing (e.g. an answer of a question with
            no gold answer): left out of calibration and of test coverage (:meth:`labelled_part`). ``None``: every
            item is labelled (when ``labels`` are given).

    Example:
        >>> cs = ConformalScores(torch.tensor([[0.2, 0.8], [0.6, 0.4]]), labels=torch.tensor([[1, 0], [0, 1]]).bool())
        >>> cs.calibration_scores("all")
        tensor([0.2000, 0.4000], dtype=torch.float64)
    """

    scores: Tensor
    labels: Tensor | None = None
    mask: Tensor | None = None
    candidates: Sequence[str] | None = None
    keys: Tensor | None = None
    groups: Tensor | None = None
    group_names: Sequence[str] | None = None
    units: Tensor | None = None
    labelled: Tensor | None = None

    def __post_init__(self) -> None:
        if self.scores.dim() != 2:
            raise ValueError(f"scores must have shape (N, C), got {tuple(self.scores.shape)}")
        for name in ("labels", "mask"):
            value = getattr(self, name)
            if value is not None and value.shape != self.scores.shape:
                raise ValueError(f"{name} must have the shape of scores {tuple(self.scores.shape)}")
        if self.keys is not None and self.keys.shape != self.scores.shape[:1]:
            raise ValueError(f"keys must have shape ({self.scores.shape[0]},), got {tuple(self.keys.shape)}")
        if self.units is not None and self.units.shape != self.scores.shape[:1]:
            raise ValueError(f"units must have shape ({self.scores.shape[0]},), got {tuple(self.units.shape)}")
        if self.units is not None and (self.units.is_floating_point() or bool((self.units < 0).any())):
            raise ValueError("units must be non-negative integer ids")
        if self.labelled is not None and self.labelled.shape != self.scores.shape[:1]:
            raise ValueError(f"labelled must have shape ({self.scores.shape[0]},), got {tuple(self.labelled.shape)}")
        if self.groups is not None and self.groups.shape != self.scores.shape[:1]:
            raise ValueError(f"groups must have shape ({self.scores.shape[0]},), got {tuple(self.groups.shape)}")
        if self.candidates is not None and len(self.candidates) != self.scores.shape[1]:
            raise ValueError(f"got {len(self.candidates)} candidate names for {self.scores.shape[1]} candidates")

    @property
    def valid(self) -> Tensor:
        """``(N, C)`` bool mask of real candidates."""
        return torch.ones_like(self.scores, dtype=torch.bool) if self.mask is None else self.mask.bool()

    def labelled_part(self) -> ConformalScores:
        """These scores restricted to their labelled items (all of them when ``labelled`` is ``None``).

        Example:
            >>> cs = ConformalScores(torch.tensor([[0.2, 0.8], [0.6, 0.4]]), labels=torch.tensor([[1, 0], [1, 0]]).bool(),
            ...                      labelled=torch.tensor([True, False]))
            >>> cs.labelled_part().calibration_scores("all")
            tensor([0.2000], dtype=torch.float64)
        """
        if self.labelled is None or bool(self.labelled.all()):
            return self
        keep = self.labelled.bool()

        def take(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[keep.to(t.device)]

        return ConformalScores(take(self.scores), take(self.labels), take(self.mask), self.candidates, take(self.keys),
                               take(self.groups), self.group_names, take(self.units))  # fmt: skip

    def calibration_scores(self, coverage: Literal["all", "any"] = "all") -> Tensor:
        """Per item: the largest (``"all"``) or smallest (``"any"``) score over its true candidates, ``(N,)`` float64.

        An item with no true candidate gets ``-inf`` for ``"all"`` (vacuously covered) and ``+inf`` for ``"any"``
        (never covered), the conventions of :func:`~kglightning.metrics.functional.coverage.covered`.
        """
        if self.labels is None:
            raise ValueError("calibration needs labels: conformal_scores(batch) returned labels=None")
        gold = self.labels.bool() & self.valid
        s = self.scores.detach().double()
        if coverage == "all":
            return torch.where(gold, s, torch.full_like(s, -math.inf)).amax(dim=1)
        return torch.where(gold, s, torch.full_like(s, math.inf)).amin(dim=1)

    def sets(self, qhat: float | Tensor) -> Tensor:
        """``(N, C)`` bool membership of the prediction sets at threshold ``qhat`` (padding excluded): one threshold,
        or an ``(N,)`` tensor of one per item (a group's ``qhat`` for each of its items)."""
        s = self.scores.detach().double()
        if isinstance(qhat, Tensor) and qhat.dim() == 1:
            if qhat.shape[0] != s.shape[0]:
                raise ValueError(f"per-item qhat must have shape ({s.shape[0]},), got {tuple(qhat.shape)}")
            return (s <= qhat.to(device=s.device, dtype=s.dtype)[:, None]) & self.valid
        return prediction_sets(s, qhat) & self.valid


@runtime_checkable
class ConformalScorer(Protocol):
    """What a LightningModule implements to work with :class:`ConformalCallback`.

    ``attach_conformal_sets(outputs, batch, sets, qhat)`` is optional: it writes the sets (``sets[i]`` = the names or
    indices of item ``i``'s set) into the ``predict_step`` outputs; without it, the callback handles outputs that
    are a list of one dict per item, or a dict.
    """

    def conformal_scores(self, batch: Any) -> ConformalScores: ...
