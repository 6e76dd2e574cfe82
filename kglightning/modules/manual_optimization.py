"""What Lightning does for a module under automatic optimisation and leaves to a hand-optimised one.

A LightningModule with ``automatic_optimization = False`` calls ``optimizer.step()`` itself, and Lightning then
neither steps its learning-rate schedulers nor clips its gradients. :class:`HandOptimized` adds both with
Lightning's own rules (interval, frequency, ``ReduceLROnPlateau`` on its monitored metric, through the
``lr_scheduler_step`` hook; clipping in ``on_before_optimizer_step``, after a mixed-precision scaler has unscaled the
gradients), and reads the optimizer-step counter of checkpoints written while the module optimised automatically.
"""

from __future__ import annotations

import functools
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_warn

__all__ = ["HandOptimized", "adopt_automatic_step_count", "scheduler_specs"]

_MANUAL = "epoch_loop.manual_optimization.optim_step_progress"
_AUTOMATIC = "epoch_loop.automatic_optimization.optim_progress"


def adopt_automatic_step_count(checkpoint: dict[str, Any]) -> bool:
    """Carry an automatic-optimisation checkpoint's optimizer-step count over to the manual counter (in place).

    Lightning keeps the two counts apart, so a run resumed by hand-optimised code from a checkpoint that automatic
    optimisation wrote would restart ``global_step`` at 0 (and take its remaining steps again). Returns whether the
    count was carried over.

    Example:
        >>> step = {"total": {"ready": 3, "completed": 3}, "current": {"ready": 3, "completed": 3}}
        >>> zero = {"total": {"ready": 0, "completed": 0}, "current": {"ready": 0, "completed": 0}}
        >>> ck = {"loops": {"fit_loop": {_AUTOMATIC: {"optimizer": {"step": step}}, _MANUAL: zero}}}
        >>> adopt_automatic_step_count(ck), ck["loops"]["fit_loop"][_MANUAL]["total"]["completed"]
        (True, 3)
    """
    loop = checkpoint.get("loops", {}).get("fit_loop", {})
    manual = loop.get(_MANUAL)
    automatic = loop.get(_AUTOMATIC, {}).get("optimizer", {}).get("step")
    if not manual or not automatic or manual["total"]["completed"] or not automatic["total"]["completed"]:
        return False
    loop[_MANUAL] = {"total": dict(automatic["total"]), "current": dict(automatic["current"])}
    return True


def scheduler_specs(optim_conf: Any) -> list[dict[str, Any]]:
    """The learning-rate schedulers in a ``configure_optimizers`` return value, each as a dict with at least
    ``"scheduler"`` (Lightning's keys ``interval``, ``frequency``, ``monitor``, ``strict`` kept where given).

    Lightning drops those keys for a hand-optimised module, so they are read from the value itself.

    Example:
        >>> import torch
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        >>> sched = torch.optim.lr_scheduler.StepLR(opt, 1)
        >>> [s["interval"] for s in scheduler_specs({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}})]
        ['step']
        >>> scheduler_specs(([opt], [sched]))[0]["scheduler"] is sched
        True
    """
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    if isinstance(optim_conf, (LRScheduler, ReduceLROnPlateau)):
        return [{"scheduler": optim_conf}]
    if isinstance(optim_conf, dict):
        if "scheduler" in optim_conf:
            return [dict(optim_conf)]
        return scheduler_specs(optim_conf.get("lr_scheduler"))
    if isinstance(optim_conf, (list, tuple)):
        return [spec for item in optim_conf for spec in scheduler_specs(item)]
    return []


def _recording(module: Any, configure: Any) -> Any:
    out = configure()
    module._scheduler_specs = scheduler_specs(out)
    return out


class HandOptimized(L.LightningModule):
    """Mixin for hand-optimised modules: learning-rate schedulers, gradient clipping (``max_grad_norm``), and the
    step counter of older checkpoints.

    Schedulers come from ``configure_optimizers`` as for any module (also LightningCLI's ``--lr_scheduler``), with
    Lightning's meaning of ``interval`` (default ``"epoch"``), ``frequency`` and, for ``ReduceLROnPlateau``,
    ``monitor`` (or the scheduler's own ``monitor``, as LightningCLI's has) and ``strict``. Call
    :meth:`step_schedulers` with ``"step"`` after each ``optimizer.step()``; epoch schedulers are stepped in
    ``on_train_epoch_end``.
    """

    max_grad_norm: float | None = None

    def setup(self, stage: str) -> None:
        super().setup(stage)
        self._scheduler_specs: list[dict[str, Any]] = []
        # Lightning calls configure_optimizers after setup and drops the schedulers' keys: record them on the way
        configure = self.__dict__.get("_configure_optimizers", self.configure_optimizers)  # once, on repeated fits
        self._configure_optimizers = configure
        self.configure_optimizers = functools.partial(_recording, self, configure)  # type: ignore[method-assign]

    def step_schedulers(self, interval: str) -> None:
        """Step the schedulers configured for ``interval`` (``"step"`` or ``"epoch"``), as Lightning would."""
        from torch.optim.lr_scheduler import ReduceLROnPlateau

        trainer = self.trainer
        index = (trainer.fit_loop.epoch_loop.batch_idx if interval == "step" else trainer.current_epoch) + 1
        for spec in getattr(self, "_scheduler_specs", []):
            scheduler = spec["scheduler"]
            if spec.get("interval", "epoch") != interval or index % spec.get("frequency", 1):
                continue
            metric = None
            if isinstance(scheduler, ReduceLROnPlateau):
                monitor = spec.get("monitor") or getattr(scheduler, "monitor", None)
                if monitor is None:
                    raise ValueError("ReduceLROnPlateau needs a metric: give 'monitor' in its lr_scheduler dict")
                metric = trainer.callback_metrics.get(monitor)
                if metric is None:
                    message = (f"ReduceLROnPlateau monitors {monitor!r}, which is not logged; available: "
                               f"{sorted(trainer.callback_metrics)}")  # fmt: skip
                    if spec.get("strict", True):
                        raise RuntimeError(message)
                    rank_zero_warn(message + "; the learning rate is left as it is")
                    continue
            self.lr_scheduler_step(scheduler, metric)

    def on_train_epoch_end(self) -> None:
        self.step_schedulers("epoch")

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        # here the precision plugin has unscaled fp16 gradients already; clipping before optimizer.step() would clip
        # the scaled ones (65536x too large) and shrink every update by the scale
        if self.max_grad_norm is not None:
            self.clip_gradients(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        adopt_automatic_step_count(checkpoint)
