"""The documented ConformalCallback recipe through the CLI, and a ``fast_dev_run`` smoke test after a real run.

The ``fit`` and ``predict`` commands are read from the ConformalCallback section of the docs' conformal page
(docs/methods/conformal.md) and run as given
(configs/detector.yaml), with overrides for the small fixture and the tiny encoder appended. After the real ``fit``,
``fit --trainer.fast_dev_run true`` with the same arguments must leave the checkpoints (and the conformal state in
them) byte for byte as they were; then ``predict`` from ``last.ckpt`` writes the sets, whether a prediction writer
is listed before the callback (the config's, as ``+=`` puts it) or after it, on one process and on 2 DDP processes."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
RUN_DIR = Path("outputs/detector/graph_transformer")  # configs/detector.yaml's paths, relative to the run folder
DOC_PAGE = ROOT / "docs" / "methods" / "conformal.md"
DOC_SECTION = "## Prediction sets for any module: ConformalCallback"


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        KGLIGHTNING_CACHE=str(tmp_path / "cache"),
        WANDB_MODE="offline",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.run(
        [sys.executable, "-m", "kglightning", *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def _documented_commands(page: Path, section: str) -> dict[str, list[str]]:
    """The ``python -m kglightning <subcommand> ...`` commands of a page section's bash blocks, by subcommand, with
    ``configs/`` paths made absolute (the runs happen in ``tmp_path``)."""
    text = page.read_text(encoding="utf-8")
    start = text.index(section)
    end = text.find("\n## ", start + len(section))
    commands = {}
    for block in re.findall(r"```bash\n(.*?)```", text[start : end if end > 0 else None], flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:3] == ["python", "-m", "kglightning"]:
                commands[argv[3]] = [str(ROOT / a) if a.startswith("configs/") else a for a in argv[4:]]
    return commands


def _fixture_overrides(detection_dir: str, tiny_encoder_dir: str) -> list[str]:
    """configs/detector.yaml on the fixture: the tiny encoder, no proposer, a small graph encoder, 2 epochs."""
    return [
        "--data.init_args.data_dir",
        detection_dir,
        "--data.init_args.proposer",
        "null",
        "--data.init_args.encoder",
        "kglightning.data.SentenceEncoder",
        "--data.init_args.encoder.init_args.model",
        tiny_encoder_dir,
        "--data.init_args.batch_size",
        "8",
        "--model.init_args.encoder.init_args.hidden_channels",
        "16",
        "--model.init_args.encoder.init_args.heads",
        "4",
        "--trainer.max_epochs",
        "2",
        "--trainer.enable_progress_bar",
        "false",
    ]


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {f.name: (f.read_bytes(), f.stat().st_mtime_ns) for f in sorted(folder.iterdir())}


def _conformal_state(ckpt: Path) -> dict:
    state = torch.load(ckpt, weights_only=False)["callbacks"]
    (key,) = [k for k in state if k.startswith("ConformalCallback")]
    return state[key]


def test_documented_conformal_recipe_and_fast_dev_run_keep_last_ckpt(detection_dir, tiny_encoder_dir, tmp_path):
    documented = _documented_commands(DOC_PAGE, DOC_SECTION)
    fit, predict = documented["fit"], documented["predict"]
    assert "--trainer.callbacks+=kglightning.callbacks.ConformalCallback" in fit and "--ckpt_path" in predict
    fixture = _fixture_overrides(detection_dir, tiny_encoder_dir)
    _cli(tmp_path, "fit", *fit, *fixture)
    ckpt_dir = tmp_path / RUN_DIR / "checkpoints"
    before = _snapshot(ckpt_dir)
    assert sorted(before) == ["best.ckpt", "last.ckpt"]
    state = _conformal_state(ckpt_dir / "last.ckpt")
    assert state["alpha"] == 0.1 and state["n_cal"] > 0 and state["qhat"] > 0
    assert torch.load(ckpt_dir / "last.ckpt", weights_only=False)["global_step"] > 1

    # a smoke test with the same config must not replace the resume point (nor its conformal state)
    _cli(tmp_path, "fit", *fit, *fixture, "--trainer.fast_dev_run", "true")
    assert _snapshot(ckpt_dir) == before
    assert _conformal_state(ckpt_dir / "last.ckpt") == state

    # predict (the documented ckpt_path is last.ckpt, relative to the run folder): the config's writer comes before the
    # appended ConformalCallback; a second writer, appended here, after it
    late = tmp_path / "late_writer.jsonl"
    writer = ["--trainer.callbacks+=kglightning.callbacks.JsonlPredictionWriter", f"--trainer.callbacks.output={late}"]
    _cli(tmp_path, "predict", *predict, *fixture, *writer)
    early = [json.loads(line) for line in (tmp_path / RUN_DIR / "hallucination_predictions_test.jsonl").open()]
    assert len(early) == 16
    for row in early:
        assert row["conformal_qhat"] == state["qhat"] and row["conformal_full_set"] is False
        assert len(row["conformal_set"]) == len(row["prediction"])
        assert all(set(labels) <= {"faithful", "hallucinated"} for labels in row["conformal_set"])
    assert [json.loads(line) for line in late.open()] == early

    # the same on 2 DDP processes: every rank moves the callback; the ranks' rows are merged into one file, in
    # dataset order, and no rank file is left
    ddp = ["--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"]
    _cli(tmp_path, "predict", *predict, *fixture, *ddp)
    assert not list((tmp_path / RUN_DIR).glob("hallucination_predictions_test.rank*.jsonl"))
    rows = [json.loads(line) for line in (tmp_path / RUN_DIR / "hallucination_predictions_test.jsonl").open()]
    # each rank batches other graphs together, which may move a probability in its last printed digit
    for got, want in zip(rows, early, strict=True):
        assert got["hallucination_prob"] == pytest.approx(want["hallucination_prob"], abs=1e-5)
        assert {k: v for k, v in got.items() if k != "hallucination_prob"} == {
            k: v for k, v in want.items() if k != "hallucination_prob"
        }
