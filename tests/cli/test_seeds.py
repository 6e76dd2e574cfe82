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
    overrides = _overrides(detection_dir, tiny_encoder_dir)
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


def _printed(*args: str) -> dict:
    import contextlib
    import io

    import yaml

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / "configs/detector.yaml"), *args, "--print_config"])
    assert exc.value.code in (0, None)
    return yaml.safe_load(out.getvalue())["data"]["init_args"]


@pytest.mark.heavy
def test_folds_parse_from_options_a_dict_and_a_config(tmp_path):
    folds = _printed("--data.init_args.folds.k", "5", "--data.init_args.folds.fold", "2")["folds"]
    assert folds == {"k": 5, "fold": 2, "seed": 0, "validation_fraction": 0.2, "pool": ["train", "validation", "test"]}
    folds = _printed("--data.init_args.folds", "{k: 3, pool: [train, validation]}")["folds"]
    assert (folds["k"], folds["fold"], folds["pool"]) == (3, 0, ["train", "validation"])
    fragment = tmp_path / "cv.yaml"
    fragment.write_text("data:\n  init_args:\n    folds:\n      k: 4\n      pool: [train, validation]\n")
    folds = _printed("--config", str(fragment), "--data.init_args.folds.fold", "3", "--data.init_args.folds.seed", "7")[
        "folds"
    ]
    assert folds == {"k": 4, "fold": 3, "seed": 7, "validation_fraction": 0.2, "pool": ["train", "validation"]}
    assert _printed()["folds"] is None  # the published splits, as before


def test_folds_reach_the_data_module(tmp_path):
    from kglightning.cli import configured
    from kglightning.data.folds import KFold

    cli = configured(
        "seeds",
        save_config_callback=None,
        args=["--model", "lightning.pytorch.demos.boring_classes.BoringModel", "--data",
              "kglightning.datamodules.KGQADataModule", "--data.init_args.data_dir", str(tmp_path),
              "--data.init_args.folds.k", "5", "--data.init_args.folds.fold", "2",
              "--data.init_args.folds.pool", "[train, validation]", "--trainer.logger", "false"],
    )  # fmt: skip
    assert cli.datamodule.folds == KFold(k=5, fold=2, pool=["train", "validation"])


def test_seeds_options_are_checked(capsys):
    config = str(ROOT / "configs/detector.yaml")
    for argv, message in [
        (["--fold-seed", "1"], "need --folds"),
        (["--folds", "1"], "--folds must be at least 2"),
        (["--folds", "2", "--resume"], "--resume needs --output"),
    ]:
        with pytest.raises(SystemExit):
            main(["seeds", "--config", config, *argv])
        assert message in capsys.readouterr().err


def _overrides(detection_dir: str, tiny_encoder_dir: str) -> list[str]:
    return [
        "--data.init_args.data_dir", detection_dir, "--data.init_args.proposer", "null",
        "--data.init_args.encoder", "kglightning.data.SentenceEncoder",
        "--data.init_args.encoder.init_args.model", tiny_encoder_dir, "--data.init_args.batch_size", "8",
        "--model.init_args.encoder.init_args.hidden_channels", "16", "--model.init_args.encoder.init_args.heads", "4",
        "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip


@pytest.mark.e2e
def test_seeds_over_folds_resume_after_a_failure(detection_dir, tiny_encoder_dir, tmp_path, capsys, monkeypatch):
    import kglightning.cli.trainer as cli_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "cv" / "folds.json"
    argv = ["seeds", "--config", str(ROOT / "configs/detector.yaml"), "--seeds", "0", "--folds", "2",
            "--fold-pool", "train", "validation", "--output", str(out), *_overrides(detection_dir, tiny_encoder_dir)]  # fmt: skip
    real, calls = cli_module.configured, []

    def second_run_fails(*args, **kwargs):
        calls.append(kwargs["args"])
        if len(calls) == 2:
            raise RuntimeError("the machine went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(cli_module, "configured", second_run_fails)
    with pytest.raises(RuntimeError, match="went away"):
        main(argv)
    first = json.loads(out.read_text())
    assert set(first["runs"]) == {"0"} and first["complete"] is False  # the finished run was written at once
    assert first["fold_settings"] == {"k": 2, "seed": 0, "validation_fraction": 0.2, "pool": ["train", "validation"]}
    i = calls[0].index("--data.init_args.folds.fold")
    assert calls[0][i + 1] == "0" and '["train", "validation"]' in calls[0]
    assert "[1/2] fold 0/2, seed 0: test/all/f1 " in capsys.readouterr().out

    calls.clear()
    monkeypatch.setattr(cli_module, "configured", lambda *a, **k: calls.append(k["args"]) or real(*a, **k))
    assert main([*argv, "--resume"]) == 0
    assert len(calls) == 1 and calls[0][calls[0].index("--data.init_args.folds.fold") + 1] == "1"
    printed = capsys.readouterr().out
    assert "[1/2] fold 0/2, seed 0 (done before, kept): " in printed and "[2/2] fold 1/2, seed 0: " in printed
    result = json.loads(out.read_text())
    assert result["complete"] is True and result["runs"]["0"] == first["runs"]["0"]
    f1 = [result["runs"][f]["0"]["test/all/f1"] for f in ("0", "1")]
    assert result["fold_means"]["test/all/f1"] == pytest.approx({"0": f1[0], "1": f1[1]})
    assert result["summary"]["test/all/f1"]["mean"] == pytest.approx(sum(f1) / 2)
    assert result["summary"]["test/all/f1"]["std"] == pytest.approx(abs(f1[0] - f1[1]) / 2**0.5)
    assert "| scorer | all/f1 | all/auc_pr | all/auroc | f1 | auc_pr |" in printed
    assert "| detector - structural | " in printed and "/2 folds) |" in printed
    assert "| scorer |" in out.with_suffix(".md").read_text() and out.with_suffix(".png").exists()
    ckpts = tmp_path / "outputs/detector/graph_transformer/checkpoints"
    assert {"best-fold0-seed0.ckpt", "best-fold1-seed0.ckpt"} <= set(os.listdir(ckpts))

    with pytest.raises(SystemExit):  # the same output with other options: refused, nothing run
        main([*argv, "--trainer.max_epochs", "3", "--resume"])
    assert "written with other arguments (overrides: stored" in capsys.readouterr().err
