"""tools/detector_ablations.py: the table, and a run of two variants on the tiny detection fixture."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("detector_ablations", ROOT / "tools/detector_ablations.py")
ablations = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ablations)


def test_table_gives_changes_against_full():
    def s(f1, auc):
        return {"test/f1": {"mean": f1, "std": 0.01}, "test/auc_pr": {"mean": auc, "std": 0.02},
                "best/val/auc_pr": {"mean": auc - 0.1, "std": 0.0}}  # fmt: skip

    rows = ablations.table({"full": s(0.8, 0.9), "w/o marking": s(0.75, 0.92)}, [0, 1, 2]).splitlines()
    assert rows[0].startswith("| variant (seeds 0, 1, 2) |") and rows[0].endswith("| best/val/auc_pr |")
    assert rows[2] == "| full | 80.0 ± 1.0 |  | 90.0 ± 2.0 |  | 80.0 ± 0.0 |"
    assert rows[3] == "| w/o marking | 75.0 ± 1.0 | -5.0 | 92.0 ± 2.0 | +2.0 | 82.0 ± 0.0 |"


@pytest.mark.e2e
def test_two_variants_run_apart(detection_dir, tiny_encoder_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KGLIGHTNING_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "abl"
    monkeypatch.setattr(sys, "argv", [
        "detector_ablations.py", "--config", str(ROOT / "configs/detector.yaml"), "--seeds", "0", "--output", str(out),
        "--variants", "full", "question only",
        "--data.init_args.data_dir", detection_dir, "--data.init_args.proposer", "null",
        "--data.init_args.encoder", "kglightning.data.SentenceEncoder",
        "--data.init_args.encoder.init_args.model", tiny_encoder_dir, "--data.init_args.batch_size", "8",
        "--model.init_args.encoder.init_args.hidden_channels", "16", "--model.init_args.encoder.init_args.heads", "4",
        "--trainer.max_epochs", "2", "--trainer.enable_progress_bar", "false",
    ])  # fmt: skip
    ablations.main()
    result = json.loads((out / "ablations.json").read_text())["summary"]
    assert set(result) == {"full", "question only"}
    assert result["full"]["test/loss"]["mean"] != result["question only"]["test/loss"]["mean"]
    for name in ("full", "question_only"):  # each variant's checkpoints stay in its own directory
        assert (out / name / "outputs/detector/graph_transformer/checkpoints/best-seed0.ckpt").is_file()
    assert not (tmp_path / "outputs").exists()
    assert "| question only |" in (out / "ablations.md").read_text()
