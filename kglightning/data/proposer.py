"""The interface of a KBQA system that proposes answers for records (used to label detector data)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from kglightning.data.records import KGQARecord


class AnswerProposer(ABC):
    """Fills ``prediction`` (and optionally ``confidence``) of records.

    Subclass it and name the subclass by ``class_path`` as ``data.init_args.proposer`` of
    :class:`~kglightning.data.DetectionDataModule`.
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
