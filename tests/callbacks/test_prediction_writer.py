"""JsonlPredictionWriter: whole files only, no stale outputs, one merged file under DDP without padded repeats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from kglightning.callbacks import JsonlPredictionWriter
from kglightning.callbacks.prediction_writer import merge_rank_files

ROOT = Path(__file__).resolve().parents[2]


class Boom(L.LightningModule):
    """Predicts ``{"id": i}`` and raises at batch ``fail_at``."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.fail_at = fail_at

    def predict_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise RuntimeError("killed")
        return [{"id": int(i)} for i in batch]


def predict(out: Path, module: L.LightningModule, n: int = 7) -> None:
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[JsonlPredictionWriter(str(out))],
    )  # fmt: skip
    trainer.predict(module, torch.utils.data.DataLoader(list(range(n)), batch_size=2), return_predictions=False)


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def test_a_run_killed_midway_leaves_no_output_that_looks_current(tmp_path: Path):
    out = tmp_path / "preds.jsonl"
    predict(out, Boom())
    assert [r["id"] for r in rows(out)] == list(range(7))
    with pytest.raises(RuntimeError, match="killed"):
        predict(out, Boom(fail_at=2))
    assert not out.exists()  # the earlier run's file is gone, not passed off as this run's
    partial = tmp_path / ".preds.jsonl.partial"
    assert [r["id"] for r in rows(partial)] == [0, 1, 2, 3]  # what the killed run finished is kept aside
    predict(out, Boom())
    assert [r["id"] for r in rows(out)] == list(range(7)) and not partial.exists()


def test_merge_drops_the_samplers_repeats_and_restores_order(tmp_path: Path):
    # 5 items on 2 ranks: DistributedSampler gives rank 0 [0, 2, 4] and rank 1 [1, 3, 0] (0 repeated as padding)
    parts = [tmp_path / "p.rank0.jsonl", tmp_path / "p.rank1.jsonl"]
    for part, ids in zip(parts, ([0, 2, 4], [1, 3, 0])):
        part.write_text("".join(json.dumps({"id": i, "_kgl_index": [0, i]}) + "\n" for i in ids))
    assert merge_rank_files(parts, tmp_path / "p.jsonl") == (5, 1)
    assert rows(tmp_path / "p.jsonl") == [{"id": i} for i in range(5)]
    # a stale index (the previous loader's) on a different row: both rows are kept, none is lost
    parts[1].write_text(json.dumps({"id": 9, "_kgl_index": [0, 2]}) + "\n")
    assert merge_rank_files(parts, tmp_path / "p.jsonl") == (4, 0)
    assert rows(tmp_path / "p.jsonl") == [{"id": 0}, {"id": 2}, {"id": 4}, {"id": 9}]


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("padded", [False, True], ids=["lightning-sampler", "padding-sampler"])
def test_ddp_writes_one_file_in_order_without_repeats_and_no_stale_rank_files(tmp_path: Path, padded: bool):
    out = tmp_path / "preds.jsonl"
    for stale in ("preds.rank0.jsonl", "preds.rank3.jsonl"):  # a 4-process run before this one
        (tmp_path / stale).write_text('{"id": -1}\n')
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    script = str(ROOT / "tests/callbacks/_writer_ddp_run.py")
    proc = subprocess.run(
        [sys.executable, script, str(out), "7", "2", *(["padded"] if padded else [])], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert rows(out) == [{"id": i, "square": i * i} for i in range(7)]  # 7 items on 2 ranks: one was repeated
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["preds.jsonl"]
    assert f"{int(padded)} repeated by the distributed sampler dropped" in proc.stdout


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_ddp_with_an_iterable_second_loader_loses_no_row(tmp_path: Path):
    """Lightning knows no indices for an iterable loader (its batch_indices keep the last loader's): its rows are
    written without an index and all kept."""
    out = tmp_path / "preds.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    script = str(ROOT / "tests/callbacks/_writer_ddp_run.py")
    proc = subprocess.run(
        [sys.executable, script, str(out), "4", "2", "two"], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    ids = [r["id"] for r in rows(out)]
    assert ids[:4] == [0, 1, 2, 3] and sorted(ids[4:]) == list(range(100, 108))


class Unbounded(L.LightningModule):
    """Predicts a row with an infinite threshold, as a conformal set that is the full candidate set."""

    def predict_step(self, batch, batch_idx):
        return [{"id": int(i), "conformal_qhat": [0.3, float("inf")], "score": float("nan")} for i in batch]


def test_rows_are_strict_json(tmp_path: Path):
    out = tmp_path / "preds.jsonl"
    predict(out, Unbounded(), n=3)
    for line in out.open():
        row = json.loads(line, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))
        assert row["conformal_qhat"] == [0.3, None] and row["score"] is None


def test_predicting_another_split_never_writes_over_the_test_splits_rows(tmp_path: Path):
    """Issue 57: ``predict --data.init_args.predict_split validation`` (as the own-answers tutorial suggests) wrote over
    the test split's scores in the same file; ``{split}`` in the output names the split predicted."""

    class Splits(L.LightningDataModule):
        def __init__(self, predict_split: str) -> None:
            super().__init__()
            self.predict_split = predict_split

        def predict_dataloader(self):
            n = 3 if self.predict_split == "test" else 5
            return torch.utils.data.DataLoader(list(range(n)), batch_size=2)

    template = str(tmp_path / "scores_{split}.jsonl")
    for split in ("test", "validation"):
        trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[JsonlPredictionWriter(template)])  # fmt: skip
        trainer.predict(Boom(), datamodule=Splits(split), return_predictions=False)
    assert len(rows(tmp_path / "scores_test.jsonl")) == 3 and len(rows(tmp_path / "scores_validation.jsonl")) == 5
    for config in sorted((ROOT / "configs").rglob("*.yaml")):  # every shipped writer names the split
        text = config.read_text()
        if "JsonlPredictionWriter" in text:
            assert "{split}" in text, config


def test_the_output_never_goes_into_the_data_folder(tmp_path: Path):
    """Review of issue 57: ``output: data/{split}.jsonl`` beside ``data_dir: data`` replaced the test records."""
    from kglightning.fileio import OutputOverInputError

    data = tmp_path / "data"
    data.mkdir()
    (data / "test.jsonl").write_text('{"id": "q"}\n')

    class Folder(L.LightningDataModule):
        data_dir, predict_split = str(data), "test"

        def predict_dataloader(self):
            return torch.utils.data.DataLoader(list(range(3)), batch_size=2)

    trainer = L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[JsonlPredictionWriter(str(data / "{split}.jsonl"))])  # fmt: skip
    with pytest.raises(OutputOverInputError, match="inside the input folder"):
        trainer.predict(Boom(), datamodule=Folder(), return_predictions=False)
    assert (data / "test.jsonl").read_text() == '{"id": "q"}\n' and sorted(p.name for p in data.iterdir()) == [
        "test.jsonl"
    ]


def test_an_output_beside_the_data_files_is_fine_over_them_refused(tmp_path: Path):
    from types import SimpleNamespace

    from kglightning.callbacks.prediction_writer import check_apart_from_data
    from kglightning.fileio import OutputOverInputError

    data = tmp_path / "data"
    data.mkdir()
    (data / "test.jsonl").write_text("{}\n")
    dm = SimpleNamespace(data_dir=str(data), files=lambda: {"test": (str(data / "test.jsonl"), None)})
    trainer = SimpleNamespace(datamodule=dm)
    check_apart_from_data(trainer, [data / "scores_test.jsonl"])  # beside the split files: the user's choice
    with pytest.raises(OutputOverInputError, match="over the input"):
        check_apart_from_data(trainer, [data / "test.jsonl"])
    check_apart_from_data(SimpleNamespace(datamodule=SimpleNamespace(data_dir=None)), [data / "test.jsonl"])


def test_an_output_never_takes_a_split_files_name_in_the_data_folder(tmp_path: Path):
    """Second review of issue 57: ``data/{split}.jsonl`` predicting ``validation`` beside ``val.jsonl`` wrote
    ``validation.jsonl``, which the next run read as the validation split."""
    from types import SimpleNamespace

    from kglightning.callbacks.prediction_writer import check_apart_from_data
    from kglightning.fileio import OutputOverInputError

    data = tmp_path / "data"
    data.mkdir()
    dm = SimpleNamespace(data_dir=str(data), files=lambda: {"validation": (str(data / "val.jsonl"), None)})
    for name in ("validation.jsonl", "test.parquet", "dev.json"):
        with pytest.raises(OutputOverInputError, match="split file's name"):
            check_apart_from_data(SimpleNamespace(datamodule=dm), [data / name])
    check_apart_from_data(SimpleNamespace(datamodule=dm), [data / "scores_validation.jsonl"])
