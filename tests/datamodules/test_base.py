"""KGQADataModule, the record-reading base of every DataModule: splits, limits, bad records, hooks, loaders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kglightning.data.records import KGQARecord, RecordError
from kglightning.datamodules.base import KGQADataModule


def _record(qid: str) -> dict:
    return {
        "id": qid,
        "question": f"capital of {qid}?",
        "answer": ["Paris"],
        "q_entity": ["France"],
        "a_entity": ["Paris"],
        "graph": [["France", "capital", "Paris"]],
    }


def _write(folder: Path, sizes: dict[str, int], bad: dict[str, int] | None = None) -> str:
    """``sizes[split]`` good records per split; ``bad[split]`` is the 1-based line that lacks its ``question``."""
    for split, n in sizes.items():
        rows = [_record(f"{split}-{i}") for i in range(n)]
        line = (bad or {}).get(split)
        if line:
            del rows[line - 1]["question"]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def test_max_records_per_split_and_predict_split(tmp_path):
    folder = _write(tmp_path, {"train": 7, "validation": 5, "test": 4})
    dm = KGQADataModule(data_dir=folder, batch_size=3, max_records={"train": 2}, predict_split="validation")
    assert [len(dm.split_records(s)) for s in ("train", "validation", "test")] == [2, 5, 4]
    assert dm.limit("train") == 2 and dm.limit("test") is None
    dm.setup("predict")
    ids = [r.id for batch in dm.predict_dataloader() for r in batch]
    assert ids == [f"validation-{i}" for i in range(5)]
    assert all(isinstance(r, KGQARecord) for r in dm.split_records("test"))
    assert len(KGQADataModule(data_dir=folder, max_records=1).split_records("validation")) == 1


def test_bad_record_raises_with_file_line_and_field_or_is_skipped(tmp_path):
    folder = _write(tmp_path, {"train": 3, "validation": 3, "test": 3}, bad={"validation": 2})
    with pytest.raises(RecordError) as err:
        KGQADataModule(data_dir=folder).split_records("validation")
    message = str(err.value)
    assert "validation.jsonl:2" in message and "question" in message
    skipping = KGQADataModule(data_dir=folder, on_bad_record="skip")
    assert [r.id for r in skipping.split_records("validation")] == ["validation-0", "validation-2"]
    assert len(skipping.read_split("validation").skipped) == 1
    with pytest.raises(ValueError, match="on_bad_record"):
        KGQADataModule(data_dir=folder, on_bad_record="ignore")  # type: ignore[arg-type]


def test_an_empty_split_is_an_error_naming_its_file(tmp_path):
    folder = _write(tmp_path, {"train": 2, "validation": 0, "test": 2})
    dm = KGQADataModule(data_dir=folder)
    with pytest.raises(RecordError, match=r"split 'validation' is empty: it holds no record") as err:
        dm.prepare_data()  # fit reads every split before any work
    assert "validation.jsonl" in str(err.value)


def test_each_split_is_read_once(tmp_path, monkeypatch):
    import kglightning.datamodules.base as base

    folder = _write(tmp_path, {"train": 2, "validation": 2, "test": 2})
    calls = []
    real = base.read_records
    monkeypatch.setattr(base, "read_records", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    dm = KGQADataModule(data_dir=folder)
    dm.prepare_data()
    dm.setup("fit")
    dm.split_records("train")
    assert sorted(Path(c).name for c in calls) == ["test.jsonl", "train.jsonl", "validation.jsonl"]


def test_dataset_key_follows_what_the_records_are(tmp_path):
    folder = _write(tmp_path, {"train": 3, "validation": 2, "test": 2})
    key = KGQADataModule(data_dir=folder).dataset_key("train")
    assert key == KGQADataModule(data_dir=folder, batch_size=99).dataset_key("train")  # batching is not data
    assert key != KGQADataModule(data_dir=folder, max_records=2).dataset_key("train")
    assert key != KGQADataModule(data_dir=folder, on_bad_record="skip").dataset_key("train")
    assert key != KGQADataModule(data_dir=folder).dataset_key("test")
    (tmp_path / "train.jsonl").write_text(json.dumps(_record("other")) + "\n")
    assert key != KGQADataModule(data_dir=folder).dataset_key("train")  # the file changed


class QuestionLengths(KGQADataModule):
    """A new method's DataModule in a few lines: items are (id, question length), batches are tensors."""

    def build_split(self, split):
        return [(r.id, len(r.question)) for r in self.split_records(split)]

    def collate(self, items):
        return torch.tensor([n for _, n in items])


def test_a_subclass_overrides_only_what_is_its_own(tmp_path):
    folder = _write(tmp_path, {"train": 5, "validation": 2, "test": 3})
    dm = QuestionLengths(data_dir=folder, batch_size=2)
    dm.prepare_data()
    dm.setup("fit")
    assert set(dm.datasets) == {"train", "validation"}  # fit builds only the splits it uses
    batches = list(dm.val_dataloader())
    assert [b.tolist() for b in batches] == [[len("capital of validation-0?"), len("capital of validation-1?")]]
    torch.manual_seed(0)
    first = torch.cat(list(dm.train_dataloader())).tolist()
    assert sorted(first) == sorted(n for _, n in dm.datasets["train"])  # shuffled, nothing lost
    dm.setup("predict")
    assert sum(len(b) for b in dm.predict_dataloader()) == 3  # predict_split defaults to test


def test_printing_a_datamodule_builds_no_split(tmp_path):
    """Lightning's __str__ would call every dataloader method (and build every split); jsonargparse prints it."""
    built = []

    class Counting(KGQADataModule):
        def build_split(self, split):
            built.append(split)
            return super().build_split(split)

    dm = Counting(data_dir=_write(tmp_path, {"train": 1, "validation": 1, "test": 1}), batch_size=4)
    assert (
        str(dm)
        == repr(dm)
        == (f"Counting(data_dir={dm.data_dir!r}, batch_size=4, max_records=None, predict_split='test')")
    )
    assert built == []


def test_dataset_key_follows_a_saved_dataset_folder(tmp_path):
    import datasets

    def save(n: int) -> str:
        rows = {s: [_record(f"{s}-{i}") for i in range(n)] for s in ("train", "validation", "test")}
        folder = tmp_path / "saved"
        datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in rows.items()}).save_to_disk(str(folder))
        return str(folder)

    key = KGQADataModule(data_dir=save(2)).dataset_key("train")
    assert key == KGQADataModule(data_dir=str(tmp_path / "saved")).dataset_key("train")
    assert key != KGQADataModule(data_dir=save(3)).dataset_key("train")  # saved again with other records


def test_dataset_key_follows_hub_data_by_its_fingerprint(monkeypatch):
    import datasets

    prints = {"train": "aaa"}

    def load_dataset(name, split=None):
        ds = datasets.Dataset.from_list([_record("q0")])
        ds._fingerprint = prints[split]
        return ds

    from kglightning.data.sources.loaders import hub_fingerprint

    calls = []
    monkeypatch.setattr(
        datasets, "load_dataset", lambda name, split=None: calls.append(split) or load_dataset(name, split)
    )
    hub_fingerprint.cache_clear()
    key = KGQADataModule(data_dir="hf:owner/kgqa").dataset_key("train")
    assert key == KGQADataModule(data_dir="hf:owner/kgqa").dataset_key("train") and calls == ["train"]  # read once
    prints["train"] = "bbb"  # another revision in the local cache, seen by the next process
    hub_fingerprint.cache_clear()
    assert KGQADataModule(data_dir="hf:owner/kgqa").dataset_key("train") != key
    hub_fingerprint.cache_clear()


def test_every_process_draws_the_same_shuffle(monkeypatch):
    import torch

    from kglightning.datamodules.base import EpochShuffle

    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    dm = KGQADataModule()
    orders = []
    for process_seed in (1, 2):  # DDP processes whose torch seeds differ
        torch.manual_seed(process_seed)
        orders.append(list(EpochShuffle(20, dm.shuffle_seed())))
    assert orders[0] == orders[1] and dm.shuffle_seed() == 7


def test_a_resumed_run_sees_each_epoch_s_own_order(tmp_path):
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    folder = _write(tmp_path, {"train": 12, "validation": 2, "test": 2})

    class Orders(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: dict[int, list[str]] = {}

        def training_step(self, batch, batch_idx):
            self.seen.setdefault(self.current_epoch, []).extend(r.id for r in batch)
            return self.w.sum() * 0.0

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def run(ckpt_path=None, epochs=3):
        L.seed_everything(0)
        module = Orders()
        every = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, filename="{epoch}")
        trainer = L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                            accelerator="cpu", callbacks=[every], limit_val_batches=0, default_root_dir=tmp_path)  # fmt: skip
        trainer.fit(module, datamodule=KGQADataModule(data_dir=folder, batch_size=4), ckpt_path=ckpt_path)
        return module.seen

    whole = run()
    assert whole[0] != whole[1] != whole[2]  # every epoch its own order
    resumed = run(ckpt_path=str(tmp_path / "ckpt" / "epoch=0.ckpt"))
    assert set(resumed) == {1, 2} and resumed[1] == whole[1] and resumed[2] == whole[2]


# ---------------------------------------------------------------------- K-fold cross-validation by question


def _ids(dm: KGQADataModule) -> dict[str, list[str]]:
    return {s: [r.id for r in dm.split_records(s)] for s in ("train", "validation", "test")}


def test_folds_serve_the_pooled_questions_as_three_disjoint_splits(tmp_path, caplog):
    from kglightning.data.folds import KFold

    folder = _write(tmp_path, {"train": 20, "validation": 6, "test": 8})
    published = {s: [r.id for r in KGQADataModule(data_dir=folder).split_records(s)] for s in ("train", "validation",
                 "test")}  # fmt: skip
    tests = []
    for fold in range(3):
        dm = KGQADataModule(data_dir=folder, folds=KFold(k=3, fold=fold, seed=1, validation_fraction=0.25))
        with caplog.at_level("INFO"):
            dm.prepare_data()
        parts = _ids(dm)
        assert sorted(q for ids in parts.values() for q in ids) == sorted(q for ids in published.values() for q in ids)
        assert parts == KFold(k=3, fold=fold, seed=1, validation_fraction=0.25).assign(published)
        tests.append(set(parts["test"]))
        sizes = {s: len(v) for s, v in parts.items()}
        assert f"fold {fold}/3 (seed 1, pool train+validation+test): {sizes['train']} train, " in caplog.text
        dm.setup("test")
        assert [r.id for batch in dm.test_dataloader() for r in batch] == parts["test"]
    assert set.union(*tests) == {q for ids in published.values() for q in ids} and sum(map(len, tests)) == 34


def test_splits_outside_the_pool_are_not_read(tmp_path, monkeypatch):
    import kglightning.datamodules.base as base
    from kglightning.data.folds import KFold

    folder = _write(tmp_path, {"train": 10, "validation": 4})  # no test file at all
    calls = []
    real = base.read_records
    monkeypatch.setattr(base, "read_records", lambda *a, **k: calls.append(Path(a[0]).name) or real(*a, **k))
    dm = KGQADataModule(data_dir=folder, folds=KFold(k=2, fold=1, pool=["train", "validation"]))
    dm.prepare_data()
    assert sorted(calls) == ["train.jsonl", "validation.jsonl"]
    assert sum(len(v) for v in _ids(dm).values()) == 14
    with pytest.raises(FileNotFoundError, match=r"no file for split\(s\) \['test'\]"):
        KGQADataModule(data_dir=folder).split_records("train")  # without folds every split is needed, as before


def test_an_id_in_two_pooled_files_is_an_error_naming_both(tmp_path):
    from kglightning.data.folds import KFold

    folder = _write(tmp_path, {"train": 4, "validation": 2, "test": 2})
    (tmp_path / "test.jsonl").write_text(json.dumps(_record("train-3")) + "\n" + json.dumps(_record("x")) + "\n")
    with pytest.raises(ValueError, match=r"'train-3' is in two pooled splits: train \(.*train.jsonl\) and test "
                       r"\(.*test.jsonl\)"):  # fmt: skip
        KGQADataModule(data_dir=folder, folds=KFold(k=2)).split_records("train")
    # the test file left out of the pool: no clash
    dm = KGQADataModule(data_dir=folder, folds=KFold(k=2, pool=["train", "validation"]))
    assert len(dm.split_records("train")) + len(dm.split_records("validation")) + len(dm.split_records("test")) == 6


def test_dataset_key_differs_per_fold_and_fold_settings(tmp_path):
    from kglightning.data.folds import KFold

    folder = _write(tmp_path, {"train": 10, "validation": 4, "test": 4})
    plain = KGQADataModule(data_dir=folder)
    settings = [KFold(), KFold(fold=1), KFold(k=4), KFold(seed=1), KFold(validation_fraction=0.3),
                KFold(pool=["train", "validation"])]  # fmt: skip
    keys = {(i, s): KGQADataModule(data_dir=folder, folds=f).dataset_key(s)
            for i, f in enumerate(settings) for s in ("train", "validation", "test")}  # fmt: skip
    assert len(set(keys.values())) == len(keys)  # no two folds, settings or splits share a cache
    assert not set(keys.values()) & {plain.dataset_key(s) for s in ("train", "validation", "test")}
    assert KGQADataModule(data_dir=folder, folds=KFold(fold=1)).dataset_key("train") == keys[1, "train"]
    assert KGQADataModule(data_dir=folder, max_records=5, folds=KFold()).dataset_key("train") != keys[0, "train"]
    with pytest.raises(TypeError, match="folds must be a KFold"):
        KGQADataModule(data_dir=folder, folds={"k": 5})  # type: ignore[arg-type]
