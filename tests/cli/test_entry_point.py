"""The installed ``kglightning`` console script and ``python -m kglightning`` as a shell sees them: exit status,
``--version``, the top-level help, and one-line errors for bad data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kglightning

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, KGLIGHTNING_CACHE=str(cwd / "cache"), WANDB_MODE="offline", HF_HUB_OFFLINE="1")
    env.pop("KGLIGHTNING_TRACEBACK", None)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _console_script() -> str:
    script = shutil.which("kglightning") or str(Path(sys.executable).with_name("kglightning"))
    assert Path(script).exists(), "the kglightning console script is not installed (pip install -e .)"
    return script


def _fit_args(data_dir: str, encoder_dir: str) -> list[str]:
    return [
        "fit",
        "--config",
        str(ROOT / "configs/detector.yaml"),
        "--data.init_args.data_dir",
        data_dir,
        "--data.init_args.proposer",
        "null",
        "--data.init_args.encoder",
        "kglightning.data.SentenceEncoder",
        "--data.init_args.encoder.init_args.model",
        encoder_dir,
        "--data.init_args.batch_size",
        "16",
        "--model.init_args.encoder.init_args.hidden_channels",
        "16",
        "--model.init_args.encoder.init_args.heads",
        "2",
        "--trainer.max_epochs",
        "1",
        "--trainer.enable_progress_bar",
        "false",
    ]


def test_console_script_exits_0_after_a_successful_fit_and_tests_after_it(detection_dir, tiny_encoder_dir, tmp_path):
    proc = _run([_console_script(), *_fit_args(detection_dir, tiny_encoder_dir)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "KGLightningCLI object" not in proc.stdout + proc.stderr
    assert (tmp_path / "outputs/detector/graph_transformer/checkpoints/last.ckpt").exists()
    # configs/detector.yaml sets test_after_fit: the best checkpoint is tested in the same run
    assert "Restoring states from the checkpoint path at" in proc.stdout + proc.stderr
    assert "test/f1" in proc.stdout and "test/mostfrequent/f1" in proc.stdout


def test_version(tmp_path):
    for cmd in ([_console_script()], [sys.executable, "-m", "kglightning"]):
        proc = _run([*cmd, "--version"], tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"kglightning {kglightning.__version__}"


def test_top_level_help_lists_every_subcommand_in_plain_text(tmp_path):
    proc = _run([sys.executable, "-m", "kglightning", "--help"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("usage: kglightning "), out[:200]
    assert "__main__" not in out
    for sub in ("fit", "validate", "test", "predict", "evaluate", "build-benchmark", "conformalize", "--version"):
        assert sub in out, sub
    assert "``" not in out and ":mod:" not in out


def _write_split_files(folder: Path, records_by_split: dict[str, list[dict]]) -> str:
    folder.mkdir()
    for split, records in records_by_split.items():
        with open(folder / f"{split}.jsonl", "w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    return str(folder)


@pytest.fixture
def splits(detection_records):
    out = {}
    for split, (n, seed) in {"train": (16, 0), "validation": (8, 1), "test": (8, 2)}.items():
        out[split] = detection_records(n, seed)
        for r in out[split]:
            r["id"] = f"{split}-{r['id']}"
    return out


def test_bad_record_in_fit_is_one_line_and_exit_2(splits, tiny_encoder_dir, tmp_path):
    splits["validation"][3]["answer"] = 5
    data = _write_split_files(tmp_path / "bad", splits)
    proc = _run([sys.executable, "-m", "kglightning", *_fit_args(data, tiny_encoder_dir)], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert "validation.jsonl:4: field 'answer' expected a list of strings, got int" in proc.stderr


def test_empty_split_names_its_file_and_exits_2(splits, tiny_encoder_dir, tmp_path):
    splits["test"] = []
    data = _write_split_files(tmp_path / "empty", splits)
    proc = _run([sys.executable, "-m", "kglightning", *_fit_args(data, tiny_encoder_dir)], tmp_path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "nan%" not in proc.stdout + proc.stderr
    assert "test.jsonl: split 'test' is empty: it holds no record" in proc.stderr
