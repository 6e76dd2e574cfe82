"""The interface of a KBQA system that proposes answers for records (used to label detector data)."""

from __future__ import annotations

import json
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from kglightning.data.records import KGQARecord
from kglightning.data.store.cache import private_dir
from kglightning.data.store.cache_marks import entry_folder, entry_holding, mark_file, touch
from kglightning.data.store.temporaries import writer_temporary

log = logging.getLogger(__name__)
_MISSING = object()


class AnswerProposer(ABC):
    """Fills ``prediction`` (and optionally ``confidence``) of records.

    Subclass it and name the subclass by ``class_path`` as ``data.init_args.proposer`` of
    :class:`~kglightning.datamodules.DetectionDataModule`.
    """

    @property
    @abstractmethod
    def cache_key(self) -> str:
        """A string that changes whenever the proposals would change (configuration, model)."""

    @property
    def encoder_hint(self):
        """A text encoder the DataModule may share, or ``None``."""
        return None

    @abstractmethod
    def propose(self, records: Iterable[KGQARecord]) -> list[KGQARecord]:
        """Copies of ``records``, in order, with ``prediction`` set (an empty list is an abstention)."""

    def for_split(self, split: str) -> AnswerProposer:
        """The proposer that answers ``split`` (default: this one); one may skip work that only some splits need."""
        return self


class AnswerNodeScorer(ABC):
    """Scores every predicted answer of a record: a hallucination score in ``[0, 1]`` per predicted name.

    The LLM-based detectors of :mod:`kglightning.llm.node_judges` implement it; name one by ``class_path`` in
    ``data.init_args.baselines`` of :class:`~kglightning.datamodules.DetectionDataModule`.
    """

    #: the column prefix in the detector's test table (``test/<name>/f1``)
    name: str

    @property
    @abstractmethod
    def cache_key(self) -> str:
        """A string that changes whenever the scores would change."""

    @abstractmethod
    def score(self, records: Sequence[KGQARecord]) -> list[dict[str, float]]:
        """Per record, in order: ``{predicted name: hallucination score}``."""


def save_proposals(originals: Sequence[KGQARecord], proposed: Sequence[KGQARecord], path: str | Path) -> None:
    """Write what a proposer added to ``originals``: per record its id, ``prediction``, ``confidence`` and the
    ``extra`` keys it added or changed (one jsonl row each, written atomically). The graphs are not repeated, so
    :func:`load_proposals` is cheap. Under a kind folder of a cache (``.../proposals-v2/<dataset>/...``) the entry
    that holds ``path`` carries kglightning's marker (:mod:`~kglightning.data.store.cache_marks`)."""
    path = Path(path)
    entry = entry_holding(path)
    if entry is not None and entry != path:
        entry_folder(entry)
    private_dir(path.parent)
    tmp = writer_temporary(path, "a proposals writer")
    try:
        with tmp.open("w", encoding="utf-8") as f:
            for before, after in zip(originals, proposed, strict=True):
                extra = {k: v for k, v in after.extra.items() if before.extra.get(k, _MISSING) != v}
                row = {"id": after.id, "prediction": after.prediction, "confidence": after.confidence, "extra": extra}
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        if entry == path:  # a file entry of its own: its marker beside it
            mark_file(path)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_proposals(originals: Sequence[KGQARecord], path: str | Path) -> list[KGQARecord] | None:
    """``originals`` with the proposals saved by :func:`save_proposals` applied, or ``None`` when the file does not
    exist or does not match them (another id, another count, an unreadable row), so the caller proposes again."""
    path = Path(path)
    if not path.is_file():
        return None
    out: list[KGQARecord] = []
    try:
        with path.open(encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        if len(rows) != len(originals):
            raise ValueError(f"{len(rows)} rows for {len(originals)} records")
        for record, row in zip(originals, rows):
            if row["id"] != record.id:
                raise ValueError(f"id {row['id']!r} where {record.id!r} was expected")
            out.append(
                replace(
                    record,
                    prediction=row["prediction"],
                    confidence=row["confidence"],
                    extra={**record.extra, **row["extra"]},
                )
            )
    except (ValueError, KeyError, TypeError) as e:
        log.warning("%s: cached proposals do not match the records (%s); proposing again", path, e)
        return None
    touch(entry_holding(path))  # used now: what `kglightning cache clean --older-than` removes last
    return out
