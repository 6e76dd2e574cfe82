"""The fitted state of :class:`~kglightning.callbacks.ConformalCallback`: split-conformal thresholds, pooled and
per group, on items or on one score per exchangeable unit."""

from __future__ import annotations

import logging
import math
from typing import Literal

import torch
from torch import Tensor

from kglightning.callbacks.conformal_items import per_unit_scores
from kglightning.conformal.functional import conformal_min_n, conformal_quantile
from kglightning.conformal.scorer import ConformalScores

log = logging.getLogger("kglightning.callbacks.conformal")  # the callback's logger: its warnings are the callback's


class ConformalThresholds:
    """``qhat`` (pooled) and ``group_qhat`` (per group), fitted by :meth:`fit_scores`; see
    :class:`~kglightning.callbacks.ConformalCallback` for what they promise.

    Args:
        alpha: miscoverage level in ``(0, 1)``.
        coverage: ``"all"`` or ``"any"`` (how an item's calibration score was computed; kept with the state).
        by_group: one ``qhat`` per group.
        per_unit: ``"one"`` or ``"every"``: the score of each unit (:func:`~kglightning.conformal.functional.unit_scores`).
        seed: seeds the draws of ``"one"``.
    """

    def __init__(
        self,
        alpha: float = 0.1,
        coverage: Literal["all", "any"] = "all",
        by_group: bool = False,
        per_unit: Literal["one", "every"] = "one",
        seed: int = 0,
    ) -> None:
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        if per_unit not in ("one", "every"):
            raise ValueError(f"per_unit must be 'one' or 'every', got {per_unit!r}")
        self.alpha, self.coverage, self.by_group, self.per_unit, self.seed = alpha, coverage, by_group, per_unit, seed
        self.qhat: float | None = None
        self.n_cal: int = 0  # calibration units (items when the module gives no units)
        self.calibrated_on: Literal["items", "units"] = "items"
        self.group_qhat: dict[int, float] = {}
        self.group_n_cal: dict[int, int] = {}
        self.group_names: dict[int, str] = {}
        self._warned: set[int] = set()  # unseen groups already warned about

    @property
    def fitted(self) -> bool:
        return self.qhat is not None

    def fit_scores(
        self,
        calibration_scores: Tensor,
        groups: Tensor | None = None,
        units: Tensor | None = None,
        keys: Tensor | None = None,
    ) -> float:
        """Set ``qhat`` from per-item calibration scores ``(n,)`` (and, with ``by_group``, one per group of the
        ``(n,)`` integer ``groups``); return the pooled ``qhat``. With ``(n,)`` ``units`` the quantiles are taken
        over one score per unit (``per_unit``) and count units; ``keys`` put the items in a fixed order first."""
        s = calibration_scores.detach().double().flatten().cpu()
        if s.numel() == 0:
            raise ValueError("calibration set is empty: the validation data gave no item to calibrate on")
        for name, t in (("groups", groups), ("units", units), ("keys", keys)):
            if t is not None and t.numel() != s.numel():
                raise ValueError(f"{name} has {t.numel()} entries for {s.numel()} calibration scores")
        u = None if units is None else units.detach().long().flatten().cpu()
        k = None if keys is None else keys.detach().long().flatten().cpu()
        self.calibrated_on = "items" if u is None else "units"
        pooled = self._per_unit(s, u, k)
        self.qhat, self.n_cal = float(conformal_quantile(pooled, self.alpha)), int(pooled.numel())
        if math.isinf(self.qhat):
            log.warning(
                "ConformalCallback: %d calibration %s are too few for alpha=%g (need >= %d); qhat=+inf and every "
                "prediction set is the full candidate set%s",
                self.n_cal, self._counted(), self.alpha, conformal_min_n(self.alpha), self._why(s.numel()),
            )  # fmt: skip
        if not self.by_group:
            self.group_qhat, self.group_n_cal = {}, {}  # thresholds of an earlier grouped fit no longer apply
        else:
            if groups is None:
                raise ValueError("by_group=True needs ConformalScores.groups from the module's conformal_scores(batch)")
            g = groups.detach().long().flatten().cpu()
            self.group_qhat, self.group_n_cal = {}, {}
            for gid in torch.unique(g).tolist():
                m = g == gid
                mine = self._per_unit(s[m], None if u is None else u[m], None if k is None else k[m])
                self.group_qhat[gid] = float(conformal_quantile(mine, self.alpha))
                self.group_n_cal[gid] = int(mine.numel())
                if math.isinf(self.group_qhat[gid]):
                    log.warning(
                        "ConformalCallback: group %s has %d calibration %s, too few for alpha=%g (need >= %d): its "
                        "sets are the full candidate sets%s", self._name(gid), mine.numel(), self._counted(),
                        self.alpha, conformal_min_n(self.alpha), self._why(int(m.sum())),
                    )  # fmt: skip
        return self.qhat

    def _per_unit(self, s: Tensor, units: Tensor | None, keys: Tensor | None) -> Tensor:
        return s if units is None else per_unit_scores(s, units, self.per_unit, self.seed, keys)

    def _counted(self) -> str:
        return "items" if self.calibrated_on == "items" else "units (questions)"

    def _why(self, n_items: int) -> str:
        if self.calibrated_on == "items":
            return ""
        return (
            f" ({n_items} items; the items of one unit are not independent, so the finite-sample rank counts units, "
            "ConformalScores.units)"
        )

    def _name(self, gid: int) -> str:
        return self.group_names.get(gid, str(gid))

    def item_qhat(self, cs: ConformalScores) -> float | Tensor:
        """The threshold of each item: the pooled ``qhat``, or with ``by_group`` its group's (``(N,)`` float64; a group
        calibration never saw gets ``+inf``, full sets)."""
        if not self.by_group:
            return self.qhat
        if cs.groups is None:
            raise ValueError("by_group=True needs ConformalScores.groups from the module's conformal_scores(batch)")
        if cs.group_names is not None:
            self.group_names.update(enumerate(cs.group_names))
        ids = cs.groups.detach().long().cpu().tolist()
        unseen = sorted({i for i in ids if i not in self.group_qhat} - self._warned)
        self._warned |= set(unseen)
        if unseen:
            log.warning(
                "ConformalCallback: groups %s have no calibration item: their sets are the full candidate sets",
                [self._name(i) for i in unseen],
            )
        return torch.tensor([self.group_qhat.get(i, math.inf) for i in ids], dtype=torch.float64, device="cpu")
