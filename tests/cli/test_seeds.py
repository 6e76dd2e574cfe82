"""``kglightning seeds``: one fit and test per seed, the mean and spread of every test metric."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kglightning.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_seeds_report_mean_and_spread(detection_dir, tiny_encoder_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    overrides = [
        "--data.init_args.data_dir", detection_dir, "--data.init_args.proposer", "null",
        "--data.init_args.encoder", "kglightning.data.SentenceEncoder",
        "--data.init_args.encoder.init_args.model", tiny_encoder_dir, "--data.init_args.batch_size", "8",
        "--model.init_args.encoder.init_args.hidden_channels", "16", "--model.init_args.encoder.init_args.heads", "4",
        "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    out = tmp_path / "seeds.json"
    code = main(["seeds", "--config", str(ROOT / "configs/detector.yaml"), "--seeds", "0", "1", "--output", str(out),
                 *overrides])  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result["seeds"]) == {"0", "1"}
    f1 = [result["seeds"][s]["test/f1"] for s in ("0", "1")]
    assert result["seeds"]["0"]["test/loss"] != result["seeds"]["1"]["test/loss"]  # the seed reached the weights
    summary = result["summary"]["test/f1"]
    assert summary["mean"] == pytest.approx(sum(f1) / 2)
    assert summary["std"] == pytest.approx(abs(f1[0] - f1[1]) / 2**0.5)
    assert "| test/f1 |" in capsys.readouterr().out
    best = [result["seeds"][s]["best/val/auc_pr"] for s in ("0", "1")]  # the score the checkpoint was chosen by
    assert all(0 < b <= 1 for b in best)
    assert result["summary"]["best/val/auc_pr"]["mean"] == pytest.approx(sum(best) / 2)
    ckpts = tmp_path / "outputs/detector/graph_transformer/checkpoints"
    assert {"best.ckpt", "best-seed0.ckpt", "best-seed1.ckpt"} <= set(os.listdir(ckpts))
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.e2e
def test_answer_features_are_linked_to_the_detector(detection_dir, tiny_encoder_dir, tmp_path, monkeypatch):
    import torch

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    args = [
        "fit", "--config", str(ROOT / "configs/detector.yaml"),
        "--data.init_args.data_dir", detection_dir, "--data.init_args.proposer", "null",
        "--data.init_args.encoder", "kglightning.data.SentenceEncoder",
        "--data.init_args.encoder.init_args.model", tiny_encoder_dir, "--data.init_args.batch_size", "8",
        "--data.init_args.answer_features", "[path_score, hops]",
        "--model.init_args.encoder.init_args.hidden_channels", "16", "--model.init_args.encoder.init_args.heads", "4",
        "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    assert main(args) == 0
    ckpt = torch.load(tmp_path / "outputs/detector/graph_transformer/checkpoints/best.ckpt", weights_only=False)
    assert ckpt["hyper_parameters"]["answer_features"] == 2
