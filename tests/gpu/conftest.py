"""The GPU tier: every test here is marked ``gpu`` and skipped without CUDA (CI never has one).

``KGLIGHTNING_GPU_TIER_ON_CPU=1`` runs the same tests on the CPU (gloo instead of NCCL, no faiss-gpu) to check the
tier's own code on a machine without a GPU; that run shows nothing about GPUs.
"""

from __future__ import annotations

import os

import pytest
import torch

ON_CPU = os.environ.get("KGLIGHTNING_GPU_TIER_ON_CPU") == "1"


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(reason="needs CUDA (the GPU tier; KGLIGHTNING_GPU_TIER_ON_CPU=1 dry-runs it on the CPU)")
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available() and not ON_CPU:
                item.add_marker(skip)


def _device_recorder():
    import lightning as L

    class DeviceRecorder(L.Callback):
        """The device types of the module's parameters and buffers after every batch of every stage (Lightning moves
        a module back to the CPU at teardown, so a check after ``fit`` would see the CPU)."""

        def __init__(self) -> None:
            self.seen: set[str] = set()

        def _record(self, trainer, pl_module, *args, **kwargs) -> None:
            self.seen |= {t.device.type for t in (*pl_module.parameters(), *pl_module.buffers())}

        on_train_batch_end = on_validation_batch_end = on_test_batch_end = on_predict_batch_end = _record

    return DeviceRecorder()


@pytest.fixture
def gpu_trainer(tmp_path):
    """``gpu_trainer(**kwargs)``: a Trainer on one GPU in ``bf16-mixed`` under ``strategy="ddp"``: an NCCL process
    group of one, which refuses CPU tensors in collectives exactly as a multi-GPU run does. ``trainer.seen_devices``
    holds the device types the module's parameters and buffers had after each batch."""
    import lightning as L

    def make(**kwargs):
        recorder = _device_recorder()
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), recorder]
        defaults = dict(
            accelerator="cpu" if ON_CPU else "gpu",
            devices=1,
            strategy="ddp",
            precision="bf16-mixed",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        trainer = L.Trainer(**{**defaults, **kwargs})
        trainer.seen_devices = recorder.seen
        return trainer

    return make


@pytest.fixture
def device() -> torch.device:
    """The tier's device: ``cuda:0`` (or the CPU in a dry run)."""
    return torch.device("cpu" if ON_CPU else "cuda:0")
