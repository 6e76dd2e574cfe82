"""LightningDataModule for hallucination detection: one augmented graph per question with proposed answers."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader
from torch_geometric.data import Batch, Data

from kglightning.data.detection_graphs import DetectionStats, build_detection_graph, node_texts
from kglightning.data.embeddings import EmbeddingCache, SentenceEncoder, default_cache_root
from kglightning.data.proposer import AnswerProposer, load_proposals, save_proposals
from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.sources.loaders import RecordList, read_records
from kglightning.data.splits import SPLITS, locate_splits
from kglightning.nn.kgguard import edge_types

log = logging.getLogger(__name__)

Split = Literal["train", "validation", "test"]
#: splits that ``prepare_data`` readies per trainer function (``None``: the predict split)
_STAGE_SPLITS: dict[str, tuple[str, ...] | None] = {
    "fit": SPLITS,
    "validate": ("validation",),
    "test": ("validation", "test"),
    "predict": None,
}
#: splits that ``setup`` turns into graphs per stage
_SETUP_SPLITS: dict[str, tuple[str, ...] | None] = {
    "fit": ("train", "validation"),
    "validate": ("validation",),
    "test": ("validation", "test"),
    "predict": None,
}


class DetectionDataModule(L.LightningDataModule):
    """Graphs for KG-Guard: records with ``prediction`` become augmented subgraphs with labelled answer nodes.

    Records that carry no ``prediction`` get one from ``proposer`` (a KBQA system, by default none); its output
    is cached per dataset and proposer configuration, so it runs once. Text embeddings of node labels, relations
    and questions are computed once in :meth:`prepare_data` and cached on disk.

    Args:
        data_dir: dataset folder (see :func:`~kglightning.data.splits.locate_splits`), or ``None`` for the
            embedded geography/elements benchmark, built on first use.
        proposer: KBQA system that proposes answers for records without ``prediction``.
        encoder: text encoder of nodes, relations and questions (default: the bundled all-MiniLM-L6-v2).
        cache_dir: cache root for the benchmark, proposals and embeddings (default ``$KGLIGHTNING_CACHE``).
        batch_size: graphs per batch.
        num_workers: DataLoader workers.
        on_bad_record: ``"raise"`` on the first invalid record, or ``"skip"`` it (counted and logged).
        add_reverse_edges: add an explicit reverse edge ``t → h`` for every triple.
        max_records: read at most this many records per split (quick runs), or a per-split mapping such as
            ``{train: 1500}`` (splits it does not name are read whole).
        benchmark_seed: seed of the embedded benchmark.
        predict_split: the split that ``predict`` scores.
    """

    def __init__(
        self,
        data_dir: str | None = None,
        proposer: AnswerProposer | None = None,
        encoder: SentenceEncoder | None = None,
        cache_dir: str | None = None,
        batch_size: int = 32,
        num_workers: int = 0,
        on_bad_record: Literal["raise", "skip"] = "raise",
        add_reverse_edges: bool = True,
        max_records: int | dict[Split, int] | None = None,
        benchmark_seed: int = 0,
        predict_split: Split = "test",
    ) -> None:
        super().__init__()
        self.data_dir = data_dir
        self.proposer = proposer
        self.encoder = encoder or (proposer.encoder_hint if proposer is not None else None) or SentenceEncoder()
        self.cache_root = Path(cache_dir) if cache_dir is not None else default_cache_root()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.on_bad_record = on_bad_record
        self.add_reverse_edges = add_reverse_edges
        self.max_records = max_records
        self.benchmark_seed = benchmark_seed
        self.predict_split = predict_split
        self.datasets: dict[str, list[Data]] = {}
        self.stats: dict[str, DetectionStats] = {}
        self._embeddings: EmbeddingCache | None = None
        self._read: dict[str, RecordList] = {}
        self._answered: dict[str, list[KGQARecord]] = {}
        self._embedded: set[str] = set()

    @property
    def text_dim(self) -> int:
        """Size of the text embeddings (linked to the model's ``text_dim``)."""
        return self.encoder.dim

    @property
    def embeddings(self) -> EmbeddingCache:
        if self._embeddings is None:
            self._embeddings = EmbeddingCache(self.encoder, self.cache_root / "embeddings")
        return self._embeddings

    def _files(self) -> dict[str, tuple[str, str | None]]:
        return locate_splits(self.data_dir, self.benchmark_seed, str(self.cache_root))

    def _dataset_key(self, path: str, name: str | None, split: str) -> str:
        if self.data_dir is None:
            ident = f"embedded-seed{self.benchmark_seed}:{Path(path).parent.name}"
        else:
            p = Path(path)
            stamp = f"{p.stat().st_size}-{p.stat().st_mtime_ns}" if p.is_file() else ""
            ident = f"{p.resolve()}:{name}:{stamp}"
        return hashlib.sha1(f"{ident}:{self.limit(split)}".encode()).hexdigest()[:12]

    def limit(self, split: str) -> int | None:
        """How many records of ``split`` are read at most (``None``: all)."""
        if isinstance(self.max_records, dict):
            return self.max_records.get(split)
        return self.max_records

    def read_split(self, split: str) -> RecordList:
        """The split's records as read from the data (once per process, so skips are reported once).

        Raises:
            RecordError: a bad record (``on_bad_record="raise"``), or a split with no record left.
        """
        if split not in self._read:
            path, name = self._files()[split]
            records = read_records(path, split=name, on_bad_record=self.on_bad_record, limit=self.limit(split))
            if not records:
                why = f"all {len(records.skipped)} records were skipped" if records.skipped else "it holds no record"
                raise RecordError(f"split {split!r} is empty: {why}", source=records.source)
            self._read[split] = records
        return self._read[split]

    def records(self, split: str) -> list[KGQARecord]:
        """The split's records, with predictions (from the data, the proposal cache or the proposer)."""
        if split not in self._answered:
            self._answered[split] = self._answer(split)
        return self._answered[split]

    def _answer(self, split: str) -> list[KGQARecord]:
        records = self.read_split(split)
        lacking = [r for r in records if r.prediction is None]
        if not lacking:
            return list(records)
        if self.proposer is None:
            raise RecordError(
                f"{len(lacking)} of {len(records)} records have no 'prediction' (first: id {lacking[0].id!r}); give "
                "records with predictions or set data.init_args.proposer",
                source=records.source,
                field="prediction",
            )
        path, name = self._files()[split]
        key = self._dataset_key(path, name, split)
        cache = self.cache_root / "proposals-v2" / key / self.proposer.cache_key / f"{split}.jsonl"
        cached = load_proposals(records, cache)
        if cached is not None:
            return cached
        rank_zero_info(f"proposing answers for {len(lacking)} {split} questions with {type(self.proposer).__name__}")
        proposed = iter(self.proposer.propose(lacking))
        out = [r if r.prediction is not None else next(proposed) for r in records]
        save_proposals(records, out, cache)
        return out

    def prepare_data(self) -> None:
        """Build the benchmark, the proposals and the text embeddings once (rank 0 only under DDP).

        ``fit`` prepares every split, ``validate``, ``test`` and ``predict`` the splits they read. The splits are
        read and checked before any answer is proposed or any text encoded, so that a bad or empty split fails the
        run at once.
        """
        fn = self.trainer.state.fn if self.trainer is not None else None
        splits = _STAGE_SPLITS.get(str(getattr(fn, "value", fn)) if fn is not None else "fit", SPLITS)
        splits = [self.predict_split] if splits is None else splits
        for split in splits:
            self.read_split(split)
        for split in splits:
            self._embed_split(split)

    def _embed_split(self, split: str) -> None:
        if split not in self._embedded:
            self.embeddings.add({t for r in self.records(split) for t in node_texts(r)})
            self._embedded.add(split)

    def setup(self, stage: str | None = None) -> None:
        wanted = _SETUP_SPLITS.get(stage or "", SPLITS)
        for split in [self.predict_split] if wanted is None else wanted:
            if split in self.datasets:
                continue
            records = self.records(split)
            self._embed_split(split)
            text_id = self.embeddings._index
            stats = DetectionStats()
            graphs = [g for r in records if (g := build_detection_graph(r, text_id, stats, self.add_reverse_edges))]
            if not graphs:
                raise ValueError(f"split {split!r} has no answer node to classify: {stats.summary(split)}")
            self.datasets[split], self.stats[split] = graphs, stats
            rank_zero_info(stats.summary(split))
            if stats.unmatched:
                log.warning(
                    "%s: %d predictions name no node of their subgraph, e.g. %s",
                    split,
                    stats.unmatched,
                    "; ".join(stats.unmatched_examples),
                )

    def collate(self, items: list[Data]) -> Batch:
        """Batch graphs and look their texts up in the embedding table.

        Edge features are given per edge type (:func:`~kglightning.nn.kgguard.edge_types`): ``type_text_emb (T,
        text_dim)`` and ``type_kind (T,)`` for the batch's distinct (relation, kind) pairs, and ``edge_type (E,)``.
        """
        batch = Batch.from_data_list(items)
        table = self.embeddings.table
        batch.x_text = table[batch.node_text]
        type_text, batch.type_kind, batch.edge_type = edge_types(batch.edge_text, batch.edge_kind)
        batch.type_text_emb = table[type_text]
        batch.question = batch.x_text[batch.question_index][batch.batch[batch.answer_index]]
        return batch

    def _loader(self, split: str, shuffle: bool = False) -> DataLoader:
        if split not in self.datasets:
            self.setup({"train": "fit", "validation": "validate", "test": "test"}.get(split, "predict"))
        return DataLoader(
            self.datasets[split],
            batch_size=self.batch_size,
            shuffle=shuffle,
            num_workers=self.num_workers,
            collate_fn=self.collate,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader(self.predict_split)
