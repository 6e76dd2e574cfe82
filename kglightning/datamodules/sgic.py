"""Questions with documents for SGIC: verbalized KG evidence from RoG records, or HotpotQA-style text passages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from kglightning.data.sources.passages import PassageExample, read_passage_examples
from kglightning.datamodules.base import KGQADataModule
from kglightning.retrieval.documents import DocumentSource
from kglightning.retrieval.path_documents import PathDocuments

__all__ = ["SGICDataModule"]


class SGICDataModule(KGQADataModule):
    """Batches (lists) of :class:`~kglightning.data.sources.passages.PassageExample`: question, answers, documents.

    Args:
        source: ``"kg"`` reads RoG-format records (or the embedded benchmark, ``data_dir: null``) and writes each
            question's documents with ``documents``; ``"passages"`` reads HotpotQA-style records (``question``,
            ``answer``, ``context``; see :mod:`kglightning.data.sources.passages`) from the split files of
            ``data_dir``.
        documents: how a KG record becomes documents, a :class:`~kglightning.retrieval.DocumentSource` (default
            :class:`~kglightning.retrieval.PathDocuments`: the 5 relation paths most similar to the question, with
            their grounded instances; :class:`~kglightning.retrieval.EvidenceDocuments` reads DoublyCal's evidence).
        **kwargs: :class:`~kglightning.datamodules.KGQADataModule`'s arguments (``data_dir``, ``batch_size``,
            ``max_records``, ``on_bad_record``, ``predict_split``, ...).
    """

    def __init__(
        self, source: Literal["kg", "passages"] = "kg", documents: DocumentSource | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if source not in ("kg", "passages"):
            raise ValueError(f"source must be 'kg' or 'passages', got {source!r}")
        if source == "passages" and self.data_dir is None:
            raise ValueError("source 'passages' needs data_dir: a folder with train/validation/test passage files")
        self.source = source
        # resolved now: the default is part of the keys of what is built from the documents, split after split
        self.documents = PathDocuments() if documents is None and source == "kg" else documents
        self._passages: dict[str, list[PassageExample]] = {}

    def read_published(self, split: str) -> Any:
        if self.source == "kg":
            return super().read_published(split)
        if split not in self._passages:
            path, name = self.files()[split]
            self._passages[split] = read_passage_examples(
                path, split=name, on_bad_record=self.on_bad_record, limit=self.limit(split), id_prefix=split
            )
        return self._passages[split]

    def build_split(self, split: str) -> Sequence[PassageExample]:
        if self.source == "passages":
            return list(self.read_split(split))
        records = self.split_records(split)
        if self.documents is None:
            raise ValueError("SGICDataModule(source='kg') needs a DocumentSource: documents was set to None")
        docs = self.documents(records)
        return [
            PassageExample(r.id, r.question, list(r.answer), d, {"q_entity": list(r.q_entity)})
            for r, d in zip(records, docs)
        ]
