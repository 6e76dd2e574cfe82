"""Write ``predict`` outputs as jsonl, one line per question, batch by batch; one whole file at the end."""

from __future__ import annotations

import glob
import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import lightning as L
from lightning.pytorch.callbacks import BasePredictionWriter

from kglightning.data.records import KGQARecord
from kglightning.data.splits import split_file_names
from kglightning.fileio import (
    OutputOverInputError,
    atomic_write,
    check_outputs_apart,
    clear_outputs,
    predicted_split,
)

__all__ = ["JsonlPredictionWriter", "check_apart_from_data", "merge_rank_files"]

log = logging.getLogger(__name__)

_INDEX = "_kgl_index"  # (dataloader, dataset index) of a row in a rank file; removed on merging


def merge_rank_files(parts: Sequence[Path], output: Path) -> tuple[int, int]:
    """Merge rank files into ``output`` (atomically): rows in dataset order, each index once.

    A ``DistributedSampler`` pads the dataset so that every rank gets as many batches, by repeating a few questions
    (Lightning's own predict sampler does not, a user's may); their second copies, the same index with the same
    row, are dropped here. Two different rows under one index are both kept (never lose a row). Rows without an
    index (an iterable dataset) keep rank order.

    Returns:
        ``(rows written, duplicates dropped)``.
    """
    indexed: dict[tuple[int, int], str] = {}
    unindexed: list[str] = []
    duplicates = 0
    for part in parts:
        with part.open(encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                key = row.pop(_INDEX, None)
                text = json.dumps(row, ensure_ascii=False) + "\n"
                if key is None:
                    unindexed.append(text)
                elif (k := (int(key[0]), int(key[1]))) not in indexed:
                    indexed[k] = text
                elif indexed[k] == text:
                    duplicates += 1
                else:
                    unindexed.append(text)
    with atomic_write(output) as f:
        for k in sorted(indexed):
            f.write(indexed[k])
        f.writelines(unindexed)
    return len(indexed) + len(unindexed), duplicates


def check_apart_from_data(trainer: Any, outputs: Sequence[str | os.PathLike]) -> None:
    """Refuse, before anything is written, outputs that would replace a file the trainer's datamodule reads its
    records from (its ``files()``, e.g. ``data/test.jsonl``), lie inside a dataset folder it reads whole, or take a
    split file's name in its ``data_dir`` (``validation.jsonl`` beside ``val.jsonl`` would be read as the split next
    time); without ``files()``, outputs inside its ``data_dir``. Nothing is checked for the embedded benchmark or a
    hub dataset.

    Raises:
        OutputOverInputError: naming the output and the input (:func:`~kglightning.fileio.check_outputs_apart`).
    """
    datamodule = getattr(trainer, "datamodule", None)
    data_dir = getattr(datamodule, "data_dir", None)
    if not isinstance(data_dir, (str, os.PathLike)) or str(data_dir).startswith("hf:"):
        return
    files = getattr(datamodule, "files", None)
    inputs = [path for path, _ in files().values()] if callable(files) else [data_dir]
    check_outputs_apart(outputs, inputs)
    folder = Path(os.path.realpath(data_dir))
    for out in outputs:  # a new file there under a split's name would be read as that split next time
        target = Path(os.path.realpath(out))
        if target.parent == folder and target.name in split_file_names():
            raise OutputOverInputError(f"would write {out} into the data folder {data_dir} under a split file's name "
                                       "(it would be read as that split): choose another name or folder")  # fmt: skip


def _tracks_indices(trainer: L.Trainer, dataloader_idx: int) -> bool:
    """Whether Lightning knows the dataset indices of this loader's batches (its batch sampler is wrapped to record
    them); otherwise ``batch_indices`` may be a previous loader's, and rows are written without an index."""
    from lightning.pytorch.overrides.distributed import _IndexBatchSamplerWrapper

    try:
        loader = trainer.predict_loop._combined_loader.flattened[dataloader_idx]  # type: ignore[union-attr]
    except (AttributeError, IndexError, TypeError):
        return False
    return isinstance(getattr(loader, "batch_sampler", None), _IndexBatchSamplerWrapper)


def _strict(x: Any) -> Any:
    """``x`` as strict JSON allows: a non-finite float (an infinite conformal threshold, whose set is flagged full
    beside it) becomes ``None``, through dicts and lists."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    return x


class JsonlPredictionWriter(BasePredictionWriter):
    """Appends every predicted item (a dict or a :class:`KGQARecord`) of each batch to a jsonl file.

    Rows go to ``.<name>.partial`` as they come (a killed run keeps them there), and the file becomes ``output``
    only when prediction ends, so ``output`` is always a whole run's. When prediction starts, the ``output`` of an
    earlier run is removed. Under DDP each rank writes its own part; at the end global rank 0 merges them into
    ``output`` in dataset order, dropping any question that a distributed sampler repeated to pad the last
    batches, and removes the parts. The parts are written beside ``output``, so on several machines ``output``
    must be on a file system that every rank sees.

    Args:
        output: the jsonl file to write. ``{split}`` in it is the split predicted: the datamodule's
            ``predict_split`` (``"predict"`` when it has none), so that predicting another split
            (``--data.init_args.predict_split validation``) never writes over the test split's rows. An output
            that would replace one of the datamodule's data files is refused (:func:`check_apart_from_data`).

    Example:
        >>> from types import SimpleNamespace
        >>> writer = JsonlPredictionWriter("outputs/scores_{split}.jsonl")
        >>> str(writer.resolve(SimpleNamespace(datamodule=SimpleNamespace(predict_split="validation"))))
        'outputs/scores_validation.jsonl'
    """

    def __init__(self, output: str) -> None:
        super().__init__(write_interval="batch")
        self.template = str(output)
        self.output = Path(output)
        self.num_written = 0
        self._file: IO[str] | None = None

    def resolve(self, trainer: Any) -> Path:
        """The file this run writes: ``output`` with ``{split}`` filled from the trainer's datamodule."""
        return Path(self.template.replace("{split}", predicted_split(trainer)))

    def path_for(self, trainer: L.Trainer) -> Path:
        """Where this process's rows go while predicting (``output`` itself in one process)."""
        if trainer.world_size == 1:
            return self.output
        return self.output.with_name(f"{self.output.stem}.rank{trainer.global_rank}{self.output.suffix}")

    def _partial(self, trainer: L.Trainer) -> Path:
        final = self.path_for(trainer)
        return final.with_name(f".{final.name}.partial")

    def _stale(self) -> list[Path]:
        pattern = f"{glob.escape(self.output.stem)}.rank*{glob.escape(self.output.suffix)}"
        parts = self.output.parent.glob(pattern) if self.output.parent.is_dir() else []
        return [self.output, *parts]

    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.output = self.resolve(trainer)
        check_apart_from_data(trainer, [self.output])  # never over (or inside) the records it predicts
        if trainer.is_global_zero:  # the last run's output and rank files, whatever its world size was
            self.output.parent.mkdir(parents=True, exist_ok=True)
            clear_outputs(self._stale())
        trainer.strategy.barrier("jsonl-writer-start")
        self._file = self._partial(trainer).open("w", encoding="utf-8")
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
        if self._file is None:  # called outside of trainer.predict
            self._file = self._partial(trainer).open("a", encoding="utf-8")
        indices = None
        if trainer.world_size > 1 and batch_indices is not None and _tracks_indices(trainer, dataloader_idx):
            indices = list(batch_indices)
            if len(indices) != len(prediction):
                indices = None
        for j, item in enumerate(prediction):
            row = item.to_dict() if isinstance(item, KGQARecord) else dict(item)
            if indices is not None:
                row[_INDEX] = [dataloader_idx, int(indices[j])]
            self._file.write(json.dumps(_strict(row), ensure_ascii=False, allow_nan=False) + "\n")
            self.num_written += 1
        self._file.flush()

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        os.replace(self._partial(trainer), self.path_for(trainer))
        if trainer.world_size == 1:
            print(f"wrote {self.num_written} predictions to {self.output}")
            return
        trainer.strategy.barrier("jsonl-writer-parts")
        if trainer.is_global_zero:
            parts = [
                self.output.with_name(f"{self.output.stem}.rank{r}{self.output.suffix}")
                for r in range(trainer.world_size)
            ]
            rows, duplicates = merge_rank_files(parts, self.output)
            for part in parts:
                part.unlink()
            print(
                f"wrote {rows} predictions to {self.output} (from {trainer.world_size} processes; {duplicates} "
                "repeated by the distributed sampler dropped)"
            )
        trainer.strategy.barrier("jsonl-writer-merged")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if self._file is not None:  # what was written stays in the .partial file
            self._file.close()
            self._file = None
