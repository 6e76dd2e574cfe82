"""Split-conformal prediction sets for any LightningModule that scores candidates (UAG's ECR / APSS setting).

A module takes part by implementing the :class:`~kglightning.conformal.scorer.ConformalScorer` protocol:
``conformal_scores(batch)`` returns a :class:`~kglightning.conformal.scorer.ConformalScores` (non-conformity per item
and candidate, lower = more conforming; both live in :mod:`kglightning.conformal.scorer` and are re-exported here). :class:`ConformalCallback`
fits the exact split-conformal threshold ``qhat`` (:func:`~kglightning.conformal.functional.conformal_quantile`) on
the calibration (validation) data, keeps it in its ``state_dict`` (so checkpoints keep it), adds the sets to the
``predict`` outputs and reports empirical coverage and average set size on ``test``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor

from kglightning.callbacks.conformal_items import (
    LeftOut,
    _gather_items,
    _writers_before,
    ahead_of_writers,
    all_or_none,
    attach_sets,
    check_scorer,
    gathered_units,
    labelled_scores,
    log_left_out,
    offset,
    unit_column,
    unit_coverage,
    val_loaders,
)
from kglightning.callbacks.conformal_thresholds import ConformalThresholds
from kglightning.conformal.scorer import ConformalScorer, ConformalScores
from kglightning.metrics.functional.coverage import covered, set_sizes

log = logging.getLogger(__name__)

__all__ = ["ConformalCallback", "ConformalScorer", "ConformalScores", "attach_sets"]


class ConformalCallback(ConformalThresholds, Callback):
    """Fits a split-conformal threshold on the validation data and emits prediction sets.

    ``qhat`` is the ``ceil((n+1)(1-alpha))``-th smallest of the ``n`` calibration scores (``+inf`` when that rank
    exceeds ``n``: the sets are then the full candidate sets, with ``conformal_full_set = True``). An item's
    calibration score is the max (``coverage="all"``) or min (``"any"``) non-conformity over its true candidates,
    so that ``P(every / some true candidate is in the set) >= 1 - alpha`` for exchangeable test items.

    The exchangeable unit: items are often not exchangeable one by one. The detector's items are answers, and the
    answers of one question depend on each other (a question the model gets wrong tends to have every answer
    scored alike), so that the *questions* are the exchangeable draws. A threshold fitted on every item then counts
    items in its finite-sample rank and under-covers: 5 calibration questions with 10 answers each give 50 items
    and a finite ``qhat``, which covers about 0.85 of new answers for a promised 0.9. When
    ``ConformalScores.units`` names each item's unit (its question), the callback calibrates on one score per unit
    (:func:`~kglightning.conformal.functional.unit_scores`) and ``n`` counts units, in the quantile's rank and in
    the "too few" warning alike:

    * ``per_unit="one"`` (default): the score of one item per unit, drawn at random (seeded by ``seed`` and the
      calibration data). Promise: for exchangeable units, the expected share of a test unit's items whose set
      covers the truth, each unit weighing one, is ``>= 1 - alpha`` (a random item of a random test unit is
      covered with probability ``>= 1 - alpha``).
    * ``per_unit="every"``: the largest item score of each unit. Promise: every item of a test unit is covered with
      probability ``>= 1 - alpha`` (larger sets).

    Without ``units`` every item is its own unit, and the promise needs exchangeable items.

    When it fits (``fit_on``):

    * ``"fit_end"``: once, at the end of ``fit``, on ``trainer.datamodule.val_dataloader()`` (or the trainer's
      validation loaders), module in eval mode, no grad. Checkpoints written *during* ``fit`` (``ModelCheckpoint``)
      predate this; save with ``trainer.save_checkpoint`` afterwards to keep ``qhat``. When ``test`` or ``predict``
      then loads such a checkpoint (``ckpt_path="best"``, as ``--test_after_fit`` and ``seeds`` do, or a later
      ``predict --ckpt_path`` run in a new process), ``qhat`` is fitted (again) on the same validation data, with
      the weights that are loaded. The same holds in every mode for a checkpoint without callback state
      (``save_weights_only``).
    * ``"validation"``: after every validation epoch (sanity check excepted), from the scores of that epoch, so that
      every ``ModelCheckpoint`` checkpoint holds the ``qhat`` of its weights (not a weights-only one). Note that choosing the best checkpoint
      on the same validation data makes it not strictly exchangeable with test data.
    * ``"manual"``: only when :meth:`fit` is called.

    The state (``qhat``, ``n_cal``, ``alpha``, ``coverage``) is in :meth:`state_dict`; Lightning stores it under the
    class name, so ``Trainer(callbacks=[ConformalCallback()]).predict(model, dm, ckpt_path=...)`` restores it.

    ``predict`` adds ``conformal_set``, ``conformal_qhat`` and ``conformal_full_set`` to the outputs. A prediction
    writer (:class:`BasePredictionWriter`) sees the outputs in callback order, so at ``setup("predict")`` the callback
    moves itself just ahead of any writer listed before it (as ``--trainer.callbacks+=`` lists it after a config's
    writer); every rank does the same, so DDP runs agree. ``test`` logs
    ``test/conformal_coverage`` (the share of items whose set covers the truth, as
    :class:`~kglightning.metrics.coverage.EmpiricalCoverage`) and ``test/conformal_set_size`` (the mean set size),
    each item counted once by its key under DDP; with ``units`` also ``test/conformal_unit_coverage``, the quantity
    the promise bounds (the mean over units of the share of their items covered, or of all covered with
    ``per_unit="every"``). The module must implement :class:`ConformalScorer`; ``predict`` and ``test`` run a
    second forward pass through ``conformal_scores``.

    DDP: with ``"validation"`` the per-rank calibration scores are gathered before the quantile, keeping one score per
    item key (``ConformalScores.keys``), so that the repeats a distributed sampler pads the last shard with are not
    counted and ``qhat`` does not depend on the number of processes. With
    ``"fit_end"``/``"manual"`` every rank scores the whole loader it is given (a datamodule's loader is not sharded)
    and gets the same ``qhat``.

    Groups (Mondrian): with ``by_group=True`` the module's ``ConformalScores.groups`` (e.g. the detector's grounded
    and ungrounded answers) each get a ``qhat`` fitted on their own calibration items (``group_qhat``, beside the
    pooled ``qhat``), so the coverage holds within every group; with ``units``, on one score per unit of the group
    (a question's answers of that group). A group with too few units (items, without ``units``) for ``alpha`` gets
    ``+inf`` (full sets, logged with the count); a group met in ``predict`` or ``test`` that calibration never saw
    gets full sets too. ``test`` then also logs ``test/conformal_coverage/<group>`` and
    ``test/conformal_set_size/<group>`` (and ``test/conformal_unit_coverage/<group>`` with units).

    Args:
        alpha: miscoverage level in ``(0, 1)``.
        calibration: the calibration split; only ``"val"`` for now.
        coverage: ``"all"`` (every true candidate in the set) or ``"any"`` (at least one).
        fit_on: when to fit, see above.
        by_group: one ``qhat`` per group of ``ConformalScores.groups`` (see above).
        per_unit: with ``ConformalScores.units``, ``"one"`` (a random item per unit) or ``"every"`` (each unit's
            largest score), see above.
        seed: seeds the draws of ``per_unit="one"`` (together with a digest of the calibration scores, so that one
            seed draws afresh for fresh data).

    Example:
        Any module with ``conformal_scores(batch)``; here each item has two candidate labels, the true one first, and
        the batch holds the model's probability of each:

        >>> import lightning as L
        >>> class Scorer(L.LightningModule):
        ...     def conformal_scores(self, batch):
        ...         truth = torch.tensor([True, False]).expand(len(batch), 2)
        ...         return ConformalScores(1 - batch, labels=truth, candidates=("yes", "no"))
        >>> cb = ConformalCallback(alpha=0.2, fit_on="manual")
        >>> calibration = [torch.tensor([[0.9, 0.1], [0.7, 0.3], [0.6, 0.4], [0.8, 0.2]])]
        >>> round(cb.fit(None, Scorer(), calibration), 2)  # 1 - p(true): the ceil(5 * 0.8) = 4th smallest
        0.4
        >>> test = Scorer().conformal_scores(torch.tensor([[0.95, 0.05], [0.5, 0.5]]))
        >>> test.sets(cb.qhat).tolist()  # candidates with 1 - p <= qhat; the second set is empty: no label clears it
        [[True, False], [False, False]]

        In a run, ``Trainer(callbacks=[ConformalCallback(alpha=0.1)])`` fits it at the end of ``fit`` on the
        validation data, or ``--trainer.callbacks+=kglightning.callbacks.ConformalCallback`` on the command line.
    """

    def __init__(
        self,
        alpha: float = 0.1,
        calibration: Literal["val"] = "val",
        coverage: Literal["all", "any"] = "all",
        fit_on: Literal["fit_end", "validation", "manual"] = "fit_end",
        by_group: bool = False,
        per_unit: Literal["one", "every"] = "one",
        seed: int = 0,
    ) -> None:
        Callback.__init__(self)
        if calibration != "val":
            raise ValueError(f"calibration must be 'val', got {calibration!r}")
        if coverage not in ("all", "any"):
            raise ValueError(f"coverage must be 'all' or 'any', got {coverage!r}")
        if fit_on not in ("fit_end", "validation", "manual"):
            raise ValueError(f"fit_on must be 'fit_end', 'validation' or 'manual', got {fit_on!r}")
        ConformalThresholds.__init__(self, alpha, coverage, by_group, per_unit, seed)
        self.calibration, self.fit_on = calibration, fit_on
        self._unlabelled_warned = False
        self._restored = False  # load_state_dict ran since the last setup: the loaded checkpoint held a qhat
        self._val_scores: list[Tensor] = []
        self._val_keys: list[Tensor | None] = []
        self._val_groups: list[Tensor] = []
        self._val_units: list[Tensor] = []  # unit ids, -1 where the module gave none
        self._val_left: list[LeftOut] = []  # the unlabelled items left out
        self._test_items: list[tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]] = []  # + key, unit

    # ---------------------------------------------------------------- fitting
    @torch.no_grad()
    def fit(self, trainer: L.Trainer | None, pl_module: L.LightningModule, dataloader: Iterable | None = None) -> float:
        """Fit ``qhat`` on ``dataloader`` (default: the validation loader of ``trainer``) and return it.

        The module runs in eval mode without grad; its training mode is restored afterwards.
        """
        check_scorer(pl_module)
        loaders = [dataloader] if dataloader is not None else val_loaders(trainer)
        was_training = pl_module.training
        pl_module.eval()
        scores: list[Tensor] = []
        groups: list[Tensor | None] = []
        units: list[Tensor | None] = []
        keys: list[Tensor | None] = []
        left_out: list[LeftOut] = []  # the unlabelled items, counted and logged once
        try:
            for index, loader in enumerate(loaders):
                for batch in loader:  # each batch reduced to its calibration scores at once (memory)
                    batch = pl_module.transfer_batch_to_device(batch, pl_module.device, 0)
                    cs = labelled_scores(pl_module, batch, index, left_out)
                    scores.append(cs.calibration_scores(self.coverage).cpu())
                    groups.append(cs.groups.detach().long().cpu() if cs.groups is not None else None)
                    # units and keys name items within one loader: the loader's index keeps two loaders' apart
                    units.append(offset(cs.units, index))
                    keys.append(offset(cs.keys, index))
                    if cs.group_names is not None:
                        self.group_names.update(enumerate(cs.group_names))
        finally:
            pl_module.train(was_training)
        log_left_out(left_out)
        every = bool(groups) and all(g is not None for g in groups)
        return self.fit_scores(
            torch.cat(scores) if scores else torch.empty(0, device="cpu"),
            torch.cat(groups) if self.by_group and every else None,  # type: ignore[arg-type]
            all_or_none(units, "units"),
            all_or_none(keys, "keys", required=False),
        )

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.fit_on == "fit_end":
            self.fit(trainer, pl_module)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val_scores, self._val_keys, self._val_groups, self._val_units, self._val_left = [], [], [], [], []

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if self.fit_on == "validation" and trainer.state.fn == "fit" and not trainer.sanity_checking:
            cs = labelled_scores(pl_module, batch, dataloader_idx, self._val_left)
            self._val_scores.append(cs.calibration_scores(self.coverage).detach().cpu())
            # keys and units name items within one loader: the loader's index keeps two loaders' apart
            self._val_keys.append(offset(cs.keys, dataloader_idx))
            self._val_units.append(unit_column(cs, dataloader_idx))
            if self.by_group:
                if cs.groups is None:
                    raise ValueError("by_group=True needs ConformalScores.groups from conformal_scores(batch)")
                self._val_groups.append(cs.groups.detach().long().cpu())
                if cs.group_names is not None:
                    self.group_names.update(enumerate(cs.group_names))

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # every process takes part in the gather, with or without scores of its own
        columns = [self._val_scores, self._val_units] + ([self._val_groups] if self.by_group else [])
        gathered, keyed = _gather_items(columns, self._val_keys, (torch.float64, torch.long, torch.long))
        scores, units = gathered[0], gathered_units(gathered[1])
        groups = gathered[2] if self.by_group else None
        log_left_out(self._val_left, gather=True)  # every process takes part here too
        self._val_scores, self._val_keys, self._val_groups, self._val_units, self._val_left = [], [], [], [], []
        if not scores.numel():
            return
        if not keyed and trainer.world_size > 1:
            log.warning(
                "ConformalCallback: conformal_scores(batch) gives no keys, so the items a distributed sampler repeats "
                "to pad the last shard are calibrated on twice; set ConformalScores.keys to drop them"
            )
        self.fit_scores(scores, groups, units)  # gathered by key: already in key order

    # ---------------------------------------------------------------- checks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_scorer(pl_module)
        self._restored = False  # the checkpoint restore (if any) comes after setup
        if stage == "predict":
            reordered = ahead_of_writers(self, trainer.callbacks)
            if reordered is not trainer.callbacks:
                log.info("ConformalCallback: moved ahead of the prediction writers so that they write the sets")
                trainer.callbacks = reordered  # a new list: the setup hooks still run over the old one

    def _require_fitted(self) -> None:
        if not self.fitted:
            raise RuntimeError(
                "ConformalCallback has no threshold yet: run trainer.fit with fit_on='fit_end' or 'validation', "
                "call callback.fit(trainer, model, calibration_loader), or pass ckpt_path= of a checkpoint saved "
                "after fitting"
            )

    def _refit_for_loaded_weights(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """After a checkpoint that held no qhat (saved before qhat existed, or weights only) was loaded over the
        weights qhat was fitted on, fit qhat again for the loaded weights. With ``fit_on="fit_end"`` also when no
        qhat was fitted in this process: a checkpoint written during ``fit`` predates the fit-end calibration, so a
        later ``test`` or ``predict`` run calibrates on the validation data with the weights it loaded."""
        loaded_without_qhat = trainer.ckpt_path is not None and not self._restored
        self._restored = False
        if not loaded_without_qhat or not (self.fitted or self.fit_on == "fit_end"):
            return
        before = "none" if self.qhat is None else format(self.qhat, ".6g")
        try:
            self.fit(trainer, pl_module)
        except (FileNotFoundError, ValueError) as e:
            raise RuntimeError(
                f"ConformalCallback: {trainer.ckpt_path} holds no qhat, and calibrating for its weights needs the "
                f"validation data, which failed ({e}); pass a checkpoint saved after fitting, or call "
                "callback.fit(trainer, model, calibration_loader) first"
            ) from e
        # a warning, not an info line: the CLI shows it, and predicting on the validation split itself would then
        # give sets calibrated on the very questions they are for
        log.warning(
            "ConformalCallback: %s holds no qhat; calibrated now on the validation data with its weights (qhat %s -> "
            "%.6g, %d %s); do not predict on that split", trainer.ckpt_path, before, self.qhat, self.n_cal,
            self._counted(),
        )  # fmt: skip

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._refit_for_loaded_weights(trainer, pl_module)
        self._require_fitted()
        late = _writers_before(self, trainer.callbacks)
        if late:  # only if something reordered the callbacks after setup
            raise RuntimeError(
                f"{', '.join(type(cb).__name__ for cb in late)} would write predictions before ConformalCallback "
                "adds the sets; list ConformalCallback before every prediction writer"
            )

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._refit_for_loaded_weights(trainer, pl_module)
        self._require_fitted()
        self._test_items = []

    # ---------------------------------------------------------------- outputs
    def on_predict_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        cs = pl_module.conformal_scores(batch)
        qhat = self.item_qhat(cs)
        members = cs.sets(qhat).cpu()
        names = cs.candidates
        sets = [[names[j] if names is not None else j for j in row.nonzero().flatten().tolist()] for row in members]
        qhat = qhat.tolist() if isinstance(qhat, Tensor) else qhat  # one per item with groups
        attach = getattr(pl_module, "attach_conformal_sets", None)
        if attach is not None:
            attach(outputs, batch, sets, qhat)
        else:
            attach_sets(outputs, sets, qhat)

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        cs = pl_module.conformal_scores(batch).labelled_part()
        if cs.labels is None:
            if not self._unlabelled_warned:
                self._unlabelled_warned = True
                log.warning(
                    "ConformalCallback: a test batch has no labels (records without gold answers): its items are not "
                    "counted in test/conformal_coverage"
                )
            return
        members = cs.sets(self.item_qhat(cs)).cpu()
        hit = covered(members, (cs.labels.bool() & cs.valid).cpu(), self.coverage)
        keys, units = offset(cs.keys, dataloader_idx), unit_column(cs, dataloader_idx)
        groups = cs.groups.detach().long().cpu() if cs.groups is not None else torch.zeros_like(hit, dtype=torch.long)
        self._test_items.append((hit.cpu(), set_sizes(members).cpu(), groups, keys, units))

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``test/conformal_coverage`` and ``test/conformal_set_size`` over every process's items, each item once by
        its key (the repeats a distributed sampler pads the last shard with are not counted twice)."""
        items, self._test_items = self._test_items, []
        hits, sizes, groups, keys, units = ([list(c) for c in zip(*items)]) if items else ([], [], [], [], [])
        dtypes = (torch.bool, torch.long, torch.long, torch.long)
        (hit, size, group, unit_ids), _ = _gather_items([hits, sizes, groups, units], keys, dtypes)
        if not hit.numel():
            return
        unit = gathered_units(unit_ids)
        pl_module.log("test/conformal_coverage", float(hit.float().mean()))
        pl_module.log("test/conformal_set_size", float(size.float().mean()))
        if unit is not None:
            pl_module.log("test/conformal_unit_coverage", unit_coverage(hit, unit, self.per_unit))
        if self.by_group:
            for gid in sorted(set(self.group_qhat) | set(torch.unique(group).tolist())):
                mine = group == gid
                if mine.any():
                    name = self._name(gid)
                    pl_module.log(f"test/conformal_coverage/{name}", float(hit[mine].float().mean()))
                    pl_module.log(f"test/conformal_set_size/{name}", float(size[mine].float().mean()))
                    if unit is not None:
                        value = unit_coverage(hit[mine], unit[mine], self.per_unit)
                        pl_module.log(f"test/conformal_unit_coverage/{name}", value)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        if not self.fitted:
            return {}
        return {
            "qhat": self.qhat, "n_cal": self.n_cal, "alpha": self.alpha, "coverage": self.coverage,
            "group_qhat": dict(self.group_qhat), "group_n_cal": dict(self.group_n_cal),
            "group_names": dict(self.group_names), "calibrated_on": self.calibrated_on, "per_unit": self.per_unit,
        }  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        self._restored = True
        for key in ("alpha", "coverage", "per_unit"):
            if state_dict.get(key, getattr(self, key)) != getattr(self, key):
                log.warning(
                    "ConformalCallback: the checkpoint's qhat was fitted with %s=%r, not %r; using the checkpoint's",
                    key,
                    state_dict[key],
                    getattr(self, key),
                )
        self.qhat, self.n_cal = float(state_dict["qhat"]), int(state_dict["n_cal"])
        self.alpha, self.coverage = float(state_dict["alpha"]), state_dict["coverage"]
        self.per_unit = state_dict.get("per_unit", self.per_unit)
        self.calibrated_on = state_dict.get("calibrated_on", "items")  # checkpoints before units calibrated on items
        self.group_qhat = {int(k): float(v) for k, v in state_dict.get("group_qhat", {}).items()}
        self.group_n_cal = {int(k): int(v) for k, v in state_dict.get("group_n_cal", {}).items()}
        self.group_names = {int(k): str(v) for k, v in state_dict.get("group_names", {}).items()}
        if "calibrated_on" not in state_dict:  # fitted before units: its rank may count the answers of a question
            self._restored = False
            log.warning("ConformalCallback: the checkpoint's qhat predates calibration on units (questions); fitting it "
                        "again for the loaded weights")  # fmt: skip
        elif self.by_group and not self.group_qhat:
            # as for a checkpoint without qhat: the thresholds are fitted again, by group, for the loaded weights
            self._restored = False
            log.warning("ConformalCallback: by_group=True, but the checkpoint holds no group thresholds; fitting them")
