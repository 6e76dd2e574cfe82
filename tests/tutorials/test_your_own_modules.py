"""The tutorial "Plug in your own graph encoder or LightningModule" (docs/tutorials/your-own-modules.md), run as a
reader would: its Python block is saved as ``my_models.py`` in a fresh folder and its commands run there, with a tiny
text encoder and two epochs added. The runs must have used the page's classes (the encoder's layers are in the
checkpoint; the module's class and its ``smoothing`` are in the saved config and hyperparameters) and their losses
must fall. That the smoothed targets are what ``SmoothedDetector.training_step`` trains on is not asserted: the
loss it logs has the base class's name."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import torch

PAGE = "docs/tutorials/your-own-modules.md"
pytestmark = [pytest.mark.e2e, pytest.mark.heavy]


def train_losses(folder: Path) -> list[float]:
    rows = list(csv.DictReader((folder / "metrics.csv").open()))
    return [float(r["train/loss_epoch"]) for r in rows if r.get("train/loss_epoch")]


def test_the_tutorial_runs_as_written_with_the_readers_classes(
    tmp_path, tiny_options, page_text, page_commands, run_command
):
    text = page_text(PAGE)
    code, loading = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (tmp_path / "my_models.py").write_text(code)
    commands = page_commands(PAGE)
    assert [c[3] for c in commands] == ["fit", "fit"], commands
    ckpt = tmp_path / "outputs/detector/graph_transformer/checkpoints/last.ckpt"
    logs = tmp_path / "outputs/detector/graph_transformer"
    extra = tiny_options(small_model=False)  # the page's own encoder widths
    for command, name in zip(commands, ("gine", "smoothed")):
        run_command(command, *extra, "--trainer.logger.init_args.version", name)
        state = torch.load(ckpt, map_location="cpu", weights_only=False)
        losses = train_losses(logs / name)
        assert len(losses) == 2 and losses[-1] < losses[0], losses
        if name == "gine":  # the reader's encoder, with the page's width
            assert state["state_dict"]["net.encoder.convs.0.nn.0.weight"].shape == (64, 64)
        else:  # the reader's module, with its own argument
            assert state["hyper_parameters"]["smoothing"] == 0.05
            assert "my_models.SmoothedDetector" in (logs / name / "config.yaml").read_text()
    # the page's Python loading of the last checkpoint (the smoothed run's) works as written
    run_command(
        ["python", "-c", loading + "\nassert type(model).__name__ == 'SmoothedDetector' and model.smoothing == 0.05"]
    )
