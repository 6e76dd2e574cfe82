"""Document sources: how a KG record becomes the text documents of a method that reads documents (SGIC)."""

from __future__ import annotations

import abc
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.sources.loaders import _iter_jsonl
from kglightning.data.store.cache import files_stamp

__all__ = ["DocumentSource", "EvidenceDocuments"]

log = logging.getLogger(__name__)


class DocumentSource(abc.ABC):
    """Turns KG records into documents (a list of strings per record, best first); name a subclass by ``class_path``.

    :attr:`num_without_documents` counts the records that got none.
    """

    num_without_documents: int = 0

    @property
    def cache_key(self) -> str:
        """A string that changes whenever the documents would change (caches of derived work use it).

        Default: the class and its public attributes, which must then be JSON values (a subclass that holds
        objects, or whose documents depend on anything else such as a file's content, overrides it).

        Raises:
            TypeError: a public attribute is not a JSON value (its repr could name a memory address, which would
                change the key on every run).
        """
        settings = {
            k: v for k, v in sorted(vars(self).items()) if not k.startswith("_") and k != "num_without_documents"
        }
        try:
            text = json.dumps(settings, sort_keys=True)
        except TypeError as err:
            raise TypeError(
                f"{type(self).__qualname__}.cache_key: the default key needs JSON attributes ({err}); override "
                "cache_key with a string that changes whenever the documents would"
            ) from err
        return f"{type(self).__module__}.{type(self).__qualname__}:{hashlib.sha1(text.encode()).hexdigest()[:12]}"

    @abc.abstractmethod
    def __call__(self, records: Sequence[KGQARecord]) -> list[list[str]]:
        """Per record, its documents (an empty list when it has none)."""


class EvidenceDocuments(DocumentSource):
    """DoublyCal's grounded evidence as documents: one per evidence, its path instances and its confidence.

    Reads the ``evidence.jsonl`` a DoublyCal run writes (``outputs/doublycal/test/evidence.jsonl``: per question ``id`` and
    ``evidence``, a list of ``{"paths": [...], "confidence": c, ...}``), so SGIC's rounds can work on the evidence a
    proxy wrote and calibrated: ``"Snoopy -> sibling_of -> Spike; ... [Confidence: 0.75]"``.

    Args:
        path: the ``evidence.jsonl`` file.
        with_confidence: append ``[Confidence: c]`` to each document.
        digits: decimals of the written confidence.

    A record whose id the file does not hold, or whose evidence is empty, gets no document (counted).
    """

    def __init__(self, path: str, with_confidence: bool = True, digits: int = 2) -> None:
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"{path}: no such evidence file (run `python -m kglightning predict --config configs/doublycal.yaml`)"
            )
        self.path = path
        self.with_confidence = with_confidence
        self.digits = digits
        self._by_id: dict[str, list[str]] | None = None
        self._read_stamp = ""

    @property
    def cache_key(self) -> str:
        stamp = files_stamp(self.path)
        return f"evidence:{Path(self.path).resolve()}:{stamp}:{self.with_confidence}:{self.digits}"

    def _document(self, z: object, line: int) -> str:
        if not isinstance(z, dict) or not isinstance(z.get("paths"), list):
            raise RecordError("each evidence must be an object with a 'paths' list", source=self.path, line=line,
                              field="evidence")  # fmt: skip
        text = "; ".join(str(p) for p in z["paths"])
        conf = z.get("confidence")
        if self.with_confidence and isinstance(conf, (int, float)):
            text += f" [Confidence: {conf:.{self.digits}f}]"
        return text

    def documents_by_id(self) -> dict[str, list[str]]:
        """Question id -> documents, read once, and again if the file changed (errors name the file, the line and
        the field)."""
        stamp = files_stamp(self.path)
        if self._by_id is None or stamp != self._read_stamp:
            self._read_stamp = stamp
            out: dict[str, list[str]] = {}
            for line, row in _iter_jsonl(Path(self.path), self.path):
                if isinstance(row, RecordError):
                    raise row
                if not isinstance(row, dict) or "id" not in row:
                    raise RecordError("missing", source=self.path, line=line, field="id")
                evidence = row.get("evidence", [])
                if not isinstance(evidence, list):
                    raise RecordError("must be a list", source=self.path, line=line, field="evidence")
                out[str(row["id"])] = [d for d in (self._document(z, line) for z in evidence) if d]
            self._by_id = out
        return self._by_id

    def __call__(self, records: Sequence[KGQARecord]) -> list[list[str]]:
        by_id = self.documents_by_id()
        out = [list(by_id.get(r.id, [])) for r in records]
        missing = sum(r.id not in by_id for r in records)
        self.num_without_documents += sum(not d for d in out)
        if missing:
            log.warning("%d of %d questions are not in %s: they get no document", missing, len(records), self.path)
        return out
