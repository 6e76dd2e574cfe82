"""LightningDataModule that serves KGQA records (lists of :class:`KGQARecord`) for record-level modules."""

from __future__ import annotations

from typing import Literal

import lightning as L
from torch.utils.data import DataLoader

from kglightning.data.records import KGQARecord
from kglightning.data.sources.loaders import read_records
from kglightning.data.splits import locate_splits


def _as_list(items: list[KGQARecord]) -> list[KGQARecord]:
    return items


class KGQADataModule(L.LightningDataModule):
    """Batches of records from a RoG-format dataset, or from the embedded benchmark.

    Args:
        data_dir: dataset folder (see :func:`~kglightning.data.splits.locate_splits`) or ``None`` for the
            embedded benchmark.
        predict_split: the split served by ``predict_dataloader``.
        batch_size: records per batch.
        on_bad_record: ``"raise"`` on the first invalid record, or ``"skip"`` it (counted and logged).
        max_records: read at most this many records per split.
        benchmark_seed: seed of the embedded benchmark.
        cache_dir: cache root of the embedded benchmark.
    """

    def __init__(
        self,
        data_dir: str | None = None,
        predict_split: Literal["train", "validation", "test"] = "test",
        batch_size: int = 64,
        on_bad_record: Literal["raise", "skip"] = "raise",
        max_records: int | None = None,
        benchmark_seed: int = 0,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.predict_split = predict_split
        self.batch_size = batch_size
        self.on_bad_record = on_bad_record
        self.max_records = max_records
        self.benchmark_seed = benchmark_seed
        self.cache_dir = cache_dir
        self.records: dict[str, list[KGQARecord]] = {}

    def prepare_data(self) -> None:
        locate_splits(self.data_dir, self.benchmark_seed, self.cache_dir)

    def split_records(self, split: str) -> list[KGQARecord]:
        if split not in self.records:
            path, name = locate_splits(self.data_dir, self.benchmark_seed, self.cache_dir)[split]
            self.records[split] = list(
                read_records(path, split=name, on_bad_record=self.on_bad_record, limit=self.max_records)
            )
        return self.records[split]

    def _loader(self, split: str) -> DataLoader:
        return DataLoader(self.split_records(split), batch_size=self.batch_size, shuffle=False, collate_fn=_as_list)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_split)
