"""UAG's global error-rate controller: per-component conformal thresholds, chosen jointly by Learn-Then-Test.

A configuration is ``lambda = (alpha1, alpha2, alpha3)``, one miscoverage level per component (Eq. 4, 5, 6). The
default grid (``grid="with_off"``) takes each ``alpha_c`` in ``{0, h_c, 2 h_c, ...} < 1``: ``alpha_c = 0`` switches
the component off (threshold ``+inf``), which is how Learn-Then-Test can drop a component that does not help.
``grid="paper"`` is the paper's ``{h_c, 2 h_c, ..., 1}`` (§4.3): every component stays on, and ``alpha_c = 1``
admits nothing (threshold ``-inf``); UAG's reference runs used ``h = (0.3, 0.3, 0.1)``. The calibration pool is split three ways, disjoint and seeded:

1. **quantile split**: maps each ``alpha_c`` to the exact split-conformal threshold ``q_c(alpha_c)`` of component
   ``c``'s calibration scores (:meth:`QuestionScores.component_scores`), so the grid is fixed before the next step;
2. **calibration split**: one binomial-tail (or Hoeffding-Bentkus) p-value per configuration for
   ``H0: P(set misses the answers) > alpha``, then a FWER procedure at ``delta``;
3. **selection split**: among the valid configurations, the smallest mean set size.

With probability at least ``1 - delta`` over the calibration split, the chosen configuration's miscoverage is at
most ``alpha``. When no configuration is valid, the controller abstains (``index is None``): the level cannot be
reached with this candidate pool and calibration size, and :class:`UAGCalibration` says so rather than returning a
set with no guarantee.

The default FWER procedure is fixed-sequence testing in an order fixed before seeing data: configurations by
increasing nominal miscoverage ``1 - (1 - alpha1)(1 - alpha2)(1 - alpha3)``, so the first one tested is the full
candidate pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from kglightning.conformal.functional import conformal_quantile, ltt_select
from kglightning.conformal.uag.grid import grid_outcomes
from kglightning.conformal.uag.scores import Coverage, QuestionScores

COMPONENTS = ("retrieve_path", "retrieve_neighbor", "evaluate")


def alpha_grid(step: float) -> Tensor:
    """The levels ``{0, h, 2h, ...}`` below 1 (float64).

    Example:
        >>> alpha_grid(0.25).tolist()
        [0.0, 0.25, 0.5, 0.75]
    """
    if not 0 < step < 1:
        raise ValueError(f"grid step must be in (0, 1), got {step}")
    n = int(round(1.0 / step, 9) + 1e-9)
    n = n if n * step < 1 - 1e-9 else n - 1
    return torch.round(torch.arange(n + 1, dtype=torch.float64, device="cpu") * step, decimals=10)


def paper_alpha_grid(step: float) -> Tensor:
    """The paper's levels ``{h, 2h, ...}`` up to 1 (float64; 1 itself when ``h`` divides it).

    Example:
        >>> paper_alpha_grid(0.3).tolist(), paper_alpha_grid(0.25).tolist()
        ([0.3, 0.6, 0.9], [0.25, 0.5, 0.75, 1.0])
    """
    if not 0 < step <= 1:
        raise ValueError(f"grid step must be in (0, 1], got {step}")
    n = int(1.0 / step + 1e-9)
    return torch.round(torch.arange(1, n + 1, dtype=torch.float64, device="cpu") * step, decimals=10)


def component_thresholds(cal_scores: Tensor, alphas: Tensor) -> Tensor:
    """``q_c(alpha)`` for one component: ``+inf`` at ``alpha = 0`` (off), ``-inf`` at ``alpha = 1`` (admits
    nothing), else the exact split-conformal quantile."""
    out = torch.full(alphas.shape, float("inf"), dtype=torch.float64, device=alphas.device)
    out[alphas >= 1] = -float("inf")
    on = (alphas > 0) & (alphas < 1)
    if bool(on.any()):
        out[on] = conformal_quantile(cal_scores.double(), alphas[on])
    return out


def split_indices(n: int, fractions: Sequence[float], seed: int) -> list[Tensor]:
    """A seeded partition of ``range(n)`` into parts of the given fractions (which must sum to 1)."""
    if len(fractions) != 3 or abs(sum(fractions) - 1) > 1e-6 or min(fractions) <= 0:
        raise ValueError(f"split_fractions must be 3 positive numbers summing to 1, got {list(fractions)}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed), device="cpu")
    a = int(round(fractions[0] * n))
    b = a + int(round(fractions[1] * n))
    parts = [perm[:a], perm[a:b], perm[b:]]
    if min(len(p) for p in parts) == 0:
        raise ValueError(f"calibration pool of {n} questions is too small for split_fractions {list(fractions)}")
    return [p.sort().values for p in parts]


@dataclass
class UAGCalibration:
    """A fitted controller at one target ``alpha``: the grid, its outcomes and the chosen configuration."""

    alpha: float
    delta: float
    alphas: tuple[Tensor, Tensor, Tensor]
    thresholds: tuple[Tensor, Tensor, Tensor]
    index: int | None
    valid: Tensor
    pvalues: Tensor
    cal_risk: Tensor
    sel_size: Tensor
    n_quantile: int
    n_cal: int
    n_sel: int

    @property
    def abstained(self) -> bool:
        """No configuration certified: ``alpha`` cannot be reached."""
        return self.index is None

    def _unravel(self) -> tuple[int, int, int]:
        assert self.index is not None
        n2, n3 = len(self.alphas[1]), len(self.alphas[2])
        return self.index // (n2 * n3), (self.index // n3) % n2, self.index % n3

    @property
    def selected_alphas(self) -> tuple[float, float, float] | None:
        """The chosen ``(alpha1, alpha2, alpha3)``; ``None`` when abstaining."""
        if self.index is None:
            return None
        return tuple(float(a[i]) for a, i in zip(self.alphas, self._unravel()))  # type: ignore[return-value]

    @property
    def selected_thresholds(self) -> tuple[float, float, float]:
        """The chosen ``(q1, q2, q3)``; all ``+inf`` (the full candidate pool) when abstaining."""
        if self.index is None:
            return (float("inf"),) * 3
        return tuple(float(q[i]) for q, i in zip(self.thresholds, self._unravel()))  # type: ignore[return-value]

    def summary(self) -> dict[str, Any]:
        """A JSON-ready record of the selection."""
        out: dict[str, Any] = {
            "alpha": self.alpha,
            "delta": self.delta,
            "abstained": self.abstained,
            "n_quantile": self.n_quantile,
            "n_calibration": self.n_cal,
            "n_selection": self.n_sel,
            "grid_size": int(self.valid.numel()),
            "num_valid": int(self.valid.sum()),
        }
        if self.index is not None:
            out["selected"] = {  # threshold null: the component is off (alpha 0, threshold +inf)
                c: {"alpha": a, "threshold": q if math.isfinite(q) else None}
                for c, a, q in zip(COMPONENTS, self.selected_alphas or (), self.selected_thresholds)
            }
            out["pvalue"] = float(self.pvalues[self.index])
            out["calibration_error_rate"] = float(self.cal_risk[self.index])
            out["selection_mean_set_size"] = float(self.sel_size[self.index])
        return out


class UAGController:
    """Fits the per-component thresholds and prepares every configuration's outcomes on the calibration pool.

    :meth:`fit` does the alpha-independent work once (thresholds of the grid, losses and set sizes of every
    configuration on the calibration and selection splits); :meth:`select` then runs Learn-Then-Test for any target
    ``alpha`` in microseconds, which is what makes an alpha sweep cheap.

    Args:
        grid_step: ``h`` of the grid, one value for all components or one per component.
        grid: ``"with_off"`` (``{0, h, 2h, ...} < 1``, 0 = component off) or ``"paper"`` (``{h, 2h, ..., 1}``).
        delta: FWER level of Learn-Then-Test.
        procedure: ``"fixed_sequence"`` (order: nominal miscoverage, see the module docstring) or ``"bonferroni"``.
        pvalue: ``"binomial"`` (UAG's binomial tail bound) or ``"hoeffding_bentkus"``.
        coverage: ``"any"`` (a set covers when it holds a gold answer) or ``"all"`` (every gold answer).
        split_fractions: quantile / calibration / selection fractions of the calibration pool.
        seed: seed of the split.
    """

    def __init__(
        self,
        grid_step: float | Sequence[float] = 0.1,
        grid: Literal["with_off", "paper"] = "with_off",
        delta: float = 0.05,
        procedure: Literal["fixed_sequence", "bonferroni"] = "fixed_sequence",
        pvalue: Literal["binomial", "hoeffding_bentkus"] = "binomial",
        coverage: Coverage = "any",
        split_fractions: Sequence[float] = (1 / 3, 1 / 3, 1 / 3),
        seed: int = 0,
    ) -> None:
        steps = [grid_step] * 3 if isinstance(grid_step, int | float) else list(grid_step)
        if len(steps) != 3:
            raise ValueError(f"grid_step must be one number or three, got {grid_step!r}")
        if grid not in ("with_off", "paper"):
            raise ValueError(f"grid must be 'with_off' or 'paper', got {grid!r}")
        self.grid = grid
        make = alpha_grid if grid == "with_off" else paper_alpha_grid
        self.alphas = tuple(make(float(h)) for h in steps)
        self.delta = delta
        self.procedure = procedure
        self.pvalue = pvalue
        self.coverage = coverage
        self.split_fractions = tuple(split_fractions)
        self.seed = seed
        self.thresholds: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def order(self) -> Tensor:
        """The fixed-sequence testing order (depends on the grid only)."""
        a1, a2, a3 = torch.meshgrid(*self.alphas, indexing="ij")
        nominal = 1 - (1 - a1) * (1 - a2) * (1 - a3)
        return torch.argsort(nominal.reshape(-1), stable=True)

    def fit(self, pool: Sequence[QuestionScores]) -> UAGController:
        """Split ``pool``, fit the component thresholds and every configuration's calibration/selection outcomes."""
        self.pool = list(pool)
        quant, cal, sel = split_indices(len(pool), self.split_fractions, self.seed)
        comp = torch.stack([pool[i].component_scores(self.coverage) for i in quant.tolist()])  # (n_q, 3)
        self.thresholds = tuple(component_thresholds(comp[:, c], self.alphas[c]) for c in range(3))  # type: ignore[assignment]
        q1, q2, q3 = (t.float() for t in self.thresholds)
        cal_cov, _ = grid_outcomes([pool[i] for i in cal.tolist()], q1, q2, q3, self.coverage)
        _, sel_size = grid_outcomes([pool[i] for i in sel.tolist()], q1, q2, q3, self.coverage)
        self.cal_losses = (~cal_cov).double()
        self.sel_sizes = sel_size.double().mean(dim=1)
        self.n_splits = (len(quant), len(cal), len(sel))
        return self

    def select(self, alpha: float) -> UAGCalibration:
        """Learn-Then-Test at ``alpha`` over the fitted grid."""
        if self.thresholds is None:
            raise RuntimeError("call fit() before select()")
        res = ltt_select(
            self.cal_losses,
            self.sel_sizes,
            alpha=alpha,
            delta=self.delta,
            procedure=self.procedure,
            pvalue=self.pvalue,
            order=self.order if self.procedure == "fixed_sequence" else None,
        )
        return UAGCalibration(
            alpha=alpha,
            delta=self.delta,
            alphas=self.alphas,  # type: ignore[arg-type]
            thresholds=self.thresholds,
            index=res.index,
            valid=res.valid,
            pvalues=res.pvalues,
            cal_risk=self.cal_losses.mean(dim=1),
            sel_size=self.sel_sizes,
            n_quantile=self.n_splits[0],
            n_cal=self.n_splits[1],
            n_sel=self.n_splits[2],
        )
