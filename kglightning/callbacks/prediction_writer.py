"""Write ``predict`` outputs as jsonl, one line per question, batch by batch."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from kglightning.data.records import KGQARecord


class JsonlPredictionWriter(BasePredictionWriter):
    """Appends every predicted item (a dict or a :class:`KGQARecord`) of each batch to a jsonl file.

    The file is truncated when prediction starts. Under DDP each rank writes ``<stem>.rank<N>.jsonl`` beside
    ``output``; a single process writes ``output`` itself.

    Args:
        output: the jsonl file to write.
    """

    def __init__(self, output: str) -> None:
        super().__init__(write_interval="batch")
        self.output = Path(output)
        self.num_written = 0

    def path_for(self, trainer: L.Trainer) -> Path:
        if trainer.world_size == 1:
            return self.output
        return self.output.with_name(f"{self.output.stem}.rank{trainer.global_rank}{self.output.suffix}")

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        path = self.path_for(trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("", encoding="utf-8")
        self.num_written = 0

    def write_on_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        prediction: Sequence[Any],
        batch_indices: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        with self.path_for(trainer).open("a", encoding="utf-8") as f:
            for item in prediction:
                row = item.to_dict() if isinstance(item, KGQARecord) else item
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                self.num_written += 1

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        print(f"wrote {self.num_written} predictions to {self.path_for(trainer)}")
