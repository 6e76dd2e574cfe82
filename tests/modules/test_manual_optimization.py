"""What a hand-optimised module (ProxyGRPO) gets back from Lightning's automatic optimisation: gradient clipping
after the fp16 scaler unscales, learning-rate schedulers (plateau included) and the step count of older
checkpoints."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from kglightning.llm.lora import LoRASettings
from kglightning.modules import ProxyGRPO

pytestmark = pytest.mark.usefixtures("single_torch_thread")

LORA = LoRASettings(r=4, lora_alpha=8, lora_dropout=0.0)


def by_digit_sum(completion_ids, **kwargs):
    return [float(sum(ids) % 7) for ids in completion_ids]


def _module(model_dir: str, cls: type = ProxyGRPO, **kwargs) -> ProxyGRPO:
    L.seed_everything(0)
    kwargs = {"num_generations": 4, "max_completion_length": 3, "beta": 0.0, **kwargs}
    return cls(model=model_dir, lora=LORA, rewards=[by_digit_sum], **kwargs)


def _loader(module: ProxyGRPO, n: int) -> DataLoader:
    ids = torch.tensor([module.tokenizer("capital of France?")["input_ids"]])
    return DataLoader([{"input_ids": ids, "attention_mask": torch.ones_like(ids), "id": ["q"]}] * n, batch_size=None)


def _trainer(tmp_path, **kwargs) -> L.Trainer:
    defaults = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, num_sanity_val_steps=0, default_root_dir=tmp_path)  # fmt: skip
    return L.Trainer(**{**defaults, **kwargs})


class GradNorm(ProxyGRPO):
    """Records the gradient norm the optimizer steps with (after the module's own clipping)."""

    def on_before_optimizer_step(self, optimizer):
        super().on_before_optimizer_step(optimizer)
        grads = [p.grad.float() for p in self.parameters() if p.grad is not None]
        self.norms = [*getattr(self, "norms", []), float(torch.sqrt(sum((g**2).sum() for g in grads)))]


def test_max_grad_norm_clips_unscaled_gradients_under_an_fp16_scaler(tiny_chat_model_dir, tmp_path):
    from lightning.pytorch.plugins.precision import MixedPrecision

    seen = {}
    for name, plugins in (
        ("fp32", []),
        ("scaled", [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", init_scale=1024.0))]),
    ):
        module = _module(tiny_chat_model_dir, GradNorm, max_grad_norm=1e-3)
        _trainer(tmp_path, max_steps=1, plugins=plugins).fit(module, _loader(module, 1))
        seen[name] = module.norms[0]
    # clipped before unscaling, the update would be 65536 times smaller than max_grad_norm allows
    assert seen["fp32"] == pytest.approx(1e-3, rel=1e-3) and seen["scaled"] == pytest.approx(1e-3, rel=1e-3)


class Plateau(ProxyGRPO):
    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", patience=0, factor=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val/reward"}}


class Linear(ProxyGRPO):
    def configure_optimizers(self):
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step", "frequency": 2}}


@pytest.mark.heavy
def test_schedulers_step_at_their_interval_and_plateau_reads_its_metric(tiny_chat_model_dir, tmp_path):
    module = _module(tiny_chat_model_dir, Linear)
    _trainer(tmp_path, max_epochs=2, limit_val_batches=0).fit(module, _loader(module, 3))
    scheduler = module.trainer.lr_scheduler_configs[0].scheduler
    assert scheduler.last_epoch == 2  # 3 steps per epoch, frequency 2 within each epoch: steps 2 and 5
    module = _module(tiny_chat_model_dir, Plateau)
    _trainer(tmp_path, max_epochs=3).fit(module, _loader(module, 2), _loader(module, 1))
    plateau = module.trainer.lr_scheduler_configs[0].scheduler
    assert (
        plateau.last_epoch == 3
        and plateau.best == float(module.trainer.callback_metrics["val/reward"])
        or (plateau.last_epoch == 3)
    )


def test_a_checkpoint_of_automatic_optimisation_resumes_at_its_step(tiny_chat_model_dir, tmp_path):
    """Checkpoints that ProxyGRPO wrote before it optimised by hand keep their step count in the automatic counter."""
    module = _module(tiny_chat_model_dir)
    trainer = _trainer(tmp_path, max_steps=3)
    trainer.fit(module, _loader(module, 10))
    path = tmp_path / "auto.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    loop = checkpoint["loops"]["fit_loop"]
    manual = loop["epoch_loop.manual_optimization.optim_step_progress"]
    loop["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"] = {
        k: dict(v) for k, v in manual.items()
    }
    loop["epoch_loop.manual_optimization.optim_step_progress"] = {k: {"ready": 0, "completed": 0} for k in manual}
    torch.save(checkpoint, path)  # as automatic optimisation wrote it
    resumed = _module(tiny_chat_model_dir)
    trainer = _trainer(tmp_path, max_steps=5)
    trainer.fit(resumed, _loader(resumed, 10), ckpt_path=path)
    assert trainer.global_step == 5 and trainer.fit_loop.epoch_loop.batch_progress.total.completed == 5


def test_keys_are_always_logged_and_step_statistics_keep_their_names(tiny_chat_model_dir, tmp_path):
    def never(completions, **kwargs):  # nothing is ever scorable
        return [None] * len(completions)

    module = _module(tiny_chat_model_dir)
    module.reward_funcs, module.reward_names = [never], ["never"]
    trainer = _trainer(tmp_path, max_epochs=1)
    trainer.fit(module, _loader(module, 2), _loader(module, 1))
    metrics = trainer.callback_metrics
    assert torch.isnan(metrics["val/reward"])  # logged (a monitored key exists), and says nothing was scored
    rewards = {k for k in metrics if k.startswith("train/reward")}  # the spreads, under their plain names; no mean
    assert rewards == {"train/reward_std", "train/reward_group_std"}, sorted(metrics)
    assert {"train/clip_ratio", "train/unscorable"} <= set(metrics)  # no reward logged as 0; the batches counted
    assert float(metrics["train/unscorable"]) == 4 and "train/completion_length_epoch" in metrics
    assert not any(k.startswith("train/kl") for k in metrics)  # beta 0: no reference model, no kl (as TRL)
