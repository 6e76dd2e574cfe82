"""The record-reading LightningDataModule that every kglightning DataModule extends.

:class:`KGQADataModule` finds the splits of a RoG-format dataset (or builds the embedded benchmark), reads and checks
each split once per process, and serves its items through the four dataloaders. A method's DataModule extends it
with what is its own: how a split's records become items (:meth:`~KGQADataModule.build_split`), how items are
batched (:meth:`~KGQADataModule.collate`) and what expensive work is done once and cached
(:meth:`~KGQADataModule.prepare_split`). Used as is, it serves lists of :class:`~kglightning.data.KGQARecord`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from kglightning.data.folds import KFold
from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.sources.loaders import HF_PREFIX, RecordList, hub_fingerprint, read_records
from kglightning.data.splits import SPLITS, locate_splits
from kglightning.data.store.cache import default_cache_root, files_stamp
from kglightning.retrieval.subgraphs import PCSTSubgraphs

Split = Literal["train", "validation", "test"]
OnBadRecord = Literal["raise", "skip"]


def _as_list(items: list[Any]) -> list[Any]:
    return items


class EpochShuffle(torch.utils.data.Sampler[int]):
    """A new order of ``range(n)`` every epoch, drawn from a generator seeded by ``(seed, epoch)``.

    Lightning calls :meth:`set_epoch` before each training epoch (also after a resume, with the restored epoch), so
    epoch ``e``'s order is the same whether or not the run was interrupted. Under DDP, Lightning wraps it in a
    distributed sampler that splits this order between the processes (and passes the epoch on), so every process
    must draw the same order: the seed must be the same on all of them.

    Example:
        >>> s = EpochShuffle(5, seed=0)
        >>> first = list(s); s.set_epoch(1); second = list(s); s.set_epoch(0)
        >>> sorted(first) == [0, 1, 2, 3, 4], first == list(s), first != second
        (True, True, True)
    """

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, int(seed), 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + self.epoch) % (2**63))
        return iter(torch.randperm(self.n, generator=generator).tolist())


class KGQADataModule(L.LightningDataModule):
    """Batches of KGQA records from a RoG-format dataset, or from the embedded benchmark.

    Every split a run needs is read and checked before anything expensive happens (``prepare_data`` reads them all
    first, then calls :meth:`prepare_split` on each), and a split with no record left is an error that names its
    file. Each split is read once per process, so the loader's summary of skipped records is logged once.

    Args:
        data_dir: dataset folder (see :func:`~kglightning.data.splits.locate_splits`) or ``None`` for the
            embedded benchmark.
        batch_size: items per batch.
        num_workers: DataLoader worker processes.
        max_records: read at most this many records per split, or per named split with a mapping such as
            ``{train: 1000}`` (splits it does not name are read whole).
        on_bad_record: ``"raise"`` on the first invalid record, or ``"skip"`` it (counted and logged).
        predict_split: the split served by ``predict_dataloader``.
        benchmark_seed: seed of the embedded benchmark.
        cache_dir: cache root of the embedded benchmark and of what subclasses cache (default
            ``$KGLIGHTNING_CACHE``).
        subgraphs: re-cut every record's graph with G-Retriever's PCST (:class:`~kglightning.retrieval.PCSTSubgraphs`:
            from the record's own graph, the embedded KG or a triples file; cached under the cache root), for every
            method that reads this data module; ``None`` keeps the graphs as read.
        folds: K-fold cross-validation by question (:class:`~kglightning.data.folds.KFold`): the questions of the
            pooled published splits are cut into ``k`` folds, fold ``fold`` is served as ``test``, and the rest as
            ``validation`` (a seeded fraction) and ``train``; splits outside the pool are not read. ``max_records``
            and ``on_bad_record`` apply to the published files as read, before pooling. ``None`` serves the
            published splits.

    Example:
        >>> import json, os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> for split in ("train", "validation", "test"):
        ...     with open(os.path.join(folder, f"{split}.jsonl"), "w") as f:
        ...         _ = f.write(json.dumps({"id": f"{split}-1", "question": "capital of France?", "answer": ["Paris"],
        ...             "q_entity": ["France"], "a_entity": ["Paris"], "graph": [["France", "capital", "Paris"]]}) + "\\n")
        >>> dm = KGQADataModule(data_dir=folder, batch_size=8)
        >>> [r.id for batch in dm.test_dataloader() for r in batch]
        ['test-1']
    """

    #: the splits whose items each stage builds (``None``: the predict split)
    stage_splits: ClassVar[dict[str, tuple[str, ...] | None]] = {
        "fit": ("train", "validation"),
        "validate": ("validation",),
        "test": ("test",),
        "predict": None,
    }
    #: the splits that ``prepare_data`` reads and prepares, per trainer function (``fit`` checks them all)
    prepare_splits: ClassVar[dict[str, tuple[str, ...] | None]] = {
        "fit": SPLITS,
        "validate": ("validation",),
        "test": ("test",),
        "predict": None,
    }

    def __init__(
        self,
        data_dir: str | None = None,
        batch_size: int = 64,
        num_workers: int = 0,
        max_records: int | dict[Split, int] | None = None,
        on_bad_record: OnBadRecord = "raise",
        predict_split: Split = "test",
        benchmark_seed: int = 0,
        cache_dir: str | None = None,
        subgraphs: PCSTSubgraphs | None = None,
        folds: KFold | None = None,
    ) -> None:
        super().__init__()
        if on_bad_record not in ("raise", "skip"):
            raise ValueError(f"on_bad_record must be 'raise' or 'skip', got {on_bad_record!r}")
        self.data_dir = data_dir
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.max_records = max_records
        self.on_bad_record = on_bad_record
        self.predict_split = predict_split
        self.benchmark_seed = benchmark_seed
        self.cache_dir = cache_dir
        self.subgraphs = subgraphs
        if folds is not None and not isinstance(folds, KFold):
            raise TypeError(f"folds must be a KFold (kglightning.data.folds) or None, got {type(folds).__name__}")
        self.folds = folds
        self.datasets: dict[str, Sequence[Any]] = {}
        self._read: dict[str, RecordList] = {}
        self._published: dict[str, Sequence[Any]] = {}

    def __repr__(self) -> str:
        # Lightning's own __str__ calls every dataloader method, which builds (and for some subclasses computes)
        # every split; jsonargparse prints data modules in its messages, so keep this cheap
        return (
            f"{type(self).__name__}(data_dir={self.data_dir!r}, batch_size={self.batch_size}, "
            f"max_records={self.max_records!r}, predict_split={self.predict_split!r}"
            + (f", folds={self.folds!r})" if self.folds is not None else ")")
        )

    __str__ = __repr__

    # ------------------------------------------------------------------ records
    @property
    def cache_root(self) -> Path:
        """The cache root: ``cache_dir``, or ``$KGLIGHTNING_CACHE``."""
        return Path(self.cache_dir) if self.cache_dir is not None else default_cache_root()

    def files(self) -> dict[str, tuple[str, str | None]]:
        """``split -> (path, dataset split name)`` of the published splits (see
        :func:`~kglightning.data.splits.locate_splits`; with ``folds``, only the pooled splits must exist)."""
        required = SPLITS if self.folds is None else self.folds.pool
        return locate_splits(self.data_dir, self.benchmark_seed, str(self.cache_root), required=required)

    def limit(self, split: str) -> int | None:
        """How many records of ``split`` are read at most (``None``: all)."""
        if isinstance(self.max_records, dict):
            return self.max_records.get(split)
        return self.max_records

    def read_split(self, split: str) -> RecordList:
        """The split's records (once per process): the published split as read, or with ``folds`` the split of the
        chosen fold (see :class:`~kglightning.data.folds.KFold`).

        Raises:
            RecordError: a bad record (``on_bad_record="raise"``), or a split with no record left.
            ValueError: with ``folds``, a question id in two pooled splits, or too few questions to fold.
        """
        if split not in self._read:
            if self.folds is None:
                self._read[split] = self.read_published(split)
            else:
                self._read.update(self._fold(self.folds))
        return self._read[split]

    def read_published(self, split: str) -> RecordList:
        """The published split's records as read from its file (once per process; PCST-cut with ``subgraphs``).

        Raises:
            RecordError: a bad record (``on_bad_record="raise"``), or a split with no record left.
        """
        if split not in self._published:
            path, name = self.files()[split]
            records = read_records(path, split=name, on_bad_record=self.on_bad_record, limit=self.limit(split))
            if not records:
                why = f"all {len(records.skipped)} records were skipped" if records.skipped else "it holds no record"
                raise RecordError(f"split {split!r} is empty: {why}", source=records.source)
            if self.subgraphs is not None:
                records = self._cut(split, records)
            self._published[split] = records
        return self._published[split]  # type: ignore[return-value]

    def _fold(self, folds: KFold) -> dict[str, RecordList]:
        """The three splits of ``folds``' fold, from the pooled published splits."""
        pooled = {split: self.read_published(split) for split in folds.pool}
        files = self.files()
        sources = {split: getattr(items, "source", None) or files[split][0] for split, items in pooled.items()}
        parts = folds.assign({split: [item.id for item in items] for split, items in pooled.items()}, sources)
        by_id = {item.id: item for items in pooled.values() for item in items}
        where = ", ".join(f"{split} {sources[split]}" for split in folds.pool)
        of_records = all(isinstance(items, RecordList) for items in pooled.values())  # not e.g. SGIC's passages
        out: dict[str, RecordList] = {}
        for split, ids in parts.items():
            records = RecordList((by_id[qid] for qid in ids), source=f"fold {folds.fold}/{folds.k} of {where}")
            records.split = split
            out[split] = records.count_graph_issues() if of_records else records
        rank_zero_info(folds.describe({split: len(records) for split, records in out.items()}))
        return out

    def _cut(self, split: str, records: RecordList) -> RecordList:
        assert self.subgraphs is not None
        cache = self.cache_root / "pcst_subgraphs" / f"{split}-{self._published_key(split)}.jsonl"
        cut = RecordList(self.subgraphs.apply(records, cache), source=f"{records.source} (PCST)", split=records.split)
        cut.skipped = records.skipped
        return cut.count_graph_issues()  # of the cut graphs: a topic may have been left out, a graph emptied

    def split_records(self, split: str) -> list[KGQARecord]:
        """The records of ``split`` (a list; see :meth:`read_split`)."""
        return list(self.read_split(split))

    def dataset_key(self, split: str) -> str:
        """A short hash of what ``split``'s records are: the dataset (for a local file or folder, its path and a digest
        of its files' bytes, :func:`~kglightning.data.store.cache.files_stamp`),
        the split, ``max_records``, ``on_bad_record`` and the ``subgraphs`` settings; with ``folds``, those of every
        pooled split and the fold settings (:attr:`~kglightning.data.folds.KFold.cache_key`), so no cache mixes two
        folds. Caches of work derived from the records use it."""
        if self.folds is None:
            return self._published_key(split)
        pooled = ":".join(self._published_key(s) for s in self.folds.pool)
        return hashlib.sha1(f"{pooled}:{self.folds.cache_key}:{split}".encode()).hexdigest()[:12]

    def _published_key(self, split: str) -> str:
        key = self._source_key(split)
        if self.subgraphs is None:
            return key
        return hashlib.sha1(f"{key}:{self.subgraphs.cache_key}".encode()).hexdigest()[:12]

    def _source_key(self, split: str) -> str:
        path, name = self.files()[split]
        if self.data_dir is None:
            ident = f"embedded-seed{self.benchmark_seed}:{Path(path).parent.name}:{Path(path).name}"
        elif isinstance(path, str) and path.startswith(HF_PREFIX):  # hub data: its fingerprint names its content
            ident = f"{path}:{name}:{hub_fingerprint(path, name)}"
        else:
            p = Path(path)  # a file or a dataset folder (save_to_disk, hub snapshot): stamped by its files
            ident = f"{p.resolve() if p.exists() else path}:{name}:{files_stamp(p)}"
        return hashlib.sha1(f"{ident}:{self.limit(split)}:{self.on_bad_record}".encode()).hexdigest()[:12]

    # ------------------------------------------------------------------ hooks for subclasses
    def prepare_split(self, split: str) -> None:
        """Expensive, cacheable work for ``split`` (rank 0 only under DDP); its records are read and checked."""

    def build_split(self, split: str) -> Sequence[Any]:
        """The items of ``split`` for training, validation and test (default: its records)."""
        return self.split_records(split)

    def build_predict(self, split: str) -> Sequence[Any]:
        """The items ``predict`` serves from ``split`` (default: the items of :meth:`build_split`, built once)."""
        if split not in self.datasets:
            self.datasets[split] = self.build_split(split)
        return self.datasets[split]

    def collate(self, items: list[Any]) -> Any:
        """A batch of training, validation or test items (default: the list itself)."""
        return _as_list(items)

    def collate_predict(self, items: list[Any]) -> Any:
        """A batch of predict items (default: :meth:`collate`)."""
        return self.collate(items)

    def shuffle_seed(self) -> int:
        """The seed of the training shuffle: ``seed_everything``'s (``PL_GLOBAL_SEED``), else 0, the seed Lightning's
        own distributed sampler takes; it is the same on every DDP process, which must agree on the order.

        Epoch ``e`` is shuffled by a generator seeded from ``(seed, e)`` (:class:`EpochShuffle`), so a run resumed
        from a checkpoint at epoch ``e`` sees the order the uninterrupted run saw, not epoch 0's again."""
        return int(os.environ.get("PL_GLOBAL_SEED", 0))

    # ------------------------------------------------------------------ Lightning
    def _stage_of_trainer(self) -> str:
        fn = self.trainer.state.fn if self.trainer is not None else None
        return str(getattr(fn, "value", fn)) if fn is not None else "fit"

    def prepare_data(self) -> None:
        """Read and check every split the run needs, then :meth:`prepare_split` each (rank 0 only under DDP)."""
        splits = self.prepare_splits.get(self._stage_of_trainer(), SPLITS)
        splits = (self.predict_split,) if splits is None else splits
        for split in splits:
            self.read_split(split)
        for split in splits:
            self.prepare_split(split)

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict":
            key = f"predict:{self.predict_split}"
            if key not in self.datasets:
                self.datasets[key] = self.build_predict(self.predict_split)
            return
        wanted = self.stage_splits.get(stage or "", SPLITS)
        for split in SPLITS if wanted is None else wanted:
            if split not in self.datasets:
                self.datasets[split] = self.build_split(split)

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        if split not in self.datasets:
            self.datasets[split] = self.build_split(split)
        data = self.datasets[split]
        return DataLoader(
            data,
            batch_size=self.batch_size,
            sampler=EpochShuffle(len(data), self.shuffle_seed()) if shuffle else None,
            num_workers=self.num_workers,
            collate_fn=self.collate,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation")

    def split_dataloader(self, split: str) -> DataLoader:
        """An unshuffled loader of any split (``train``, ``validation``, ``test``), built on first use; callbacks
        that calibrate on a split of their choice read it here."""
        return self._loader(split)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        key = f"predict:{self.predict_split}"
        if key not in self.datasets:
            self.datasets[key] = self.build_predict(self.predict_split)
        return DataLoader(
            self.datasets[key],
            batch_size=self.batch_size,
            shuffle=False,
            num_workers=self.num_workers,
            collate_fn=self.collate_predict,
            persistent_workers=self.num_workers > 0,
        )
