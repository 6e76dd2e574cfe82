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
from kglightning.data.store.cache import private_dir, untrusted, untrusted_above
from kglightning.data.store.cache_marks import entry_folder, entry_holding, mark_file, set_aside, touch
from kglightning.data.store.owned_files import create_new
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
    that holds ``path`` carries kglightning's marker (:mod:`~kglightning.data.store.cache_marks`). Nothing is
    written into a folder that :func:`~kglightning.data.store.cache.untrusted` refuses (another user's, or
    writable by others): a WARNING says so, and the next run proposes again."""
    path = Path(path)
    entry = entry_holding(path)
    why = untrusted_above(path.parent)  # nothing is made in a folder another user owns or can write
    if why is None:
        if entry is not None and entry != path:
            entry_folder(entry)
        private_dir(path.parent)
        why = _folder_refused(path)
    if why is not None:
        log.warning("the proposals are not kept in %s: %s", path, why)
        return
    tmp = writer_temporary(path, "a proposals writer")
    fd = create_new(tmp)  # a new file: nothing is written through a name someone else prepared
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
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


def _folder_refused(path: Path) -> str | None:
    """Why the folder of ``path`` must not be used (:func:`~kglightning.data.store.cache.untrusted`), or ``None``."""
    try:
        return untrusted(path.parent) if path.parent.exists() else None
    except OSError as err:
        return str(err)


def load_proposals(originals: Sequence[KGQARecord], path: str | Path) -> list[KGQARecord] | None:
    """``originals`` with the proposals saved by :func:`save_proposals` applied, or ``None`` when the file does not
    exist or does not match them (another id, another count, an unreadable row), so the caller proposes again. The
    file is read only when :func:`~kglightning.data.store.cache.untrusted` passes it (this user's, and no one else
    can write it or a folder above it); one that fails in a folder that passes is set aside
    (:func:`~kglightning.data.store.cache_marks.set_aside`), and one in a folder that fails is left, with a
    WARNING."""
    path = Path(path)
    if not os.path.lexists(path):
        return None
    why = _folder_refused(path)
    if why is not None:
        log.warning("%s: cached proposals not read (%s); proposing again", path, why)
        return None
    try:
        why = untrusted(path)
    except OSError as err:
        why = str(err)
    if why is not None:
        set_aside(path, f"is not trusted ({why})")
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
