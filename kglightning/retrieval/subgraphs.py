"""PCST subgraphs as a data module option: every method reads the records with their graphs re-cut by G-Retriever's PCST.

:class:`PCSTSubgraphs` is what :class:`~kglightning.datamodules.KGQADataModule` takes as ``subgraphs``: each split's
records are read as usual, then each record's ``graph`` is replaced by the PCST subgraph of its question
(:class:`~kglightning.retrieval.pcst.PCSTRetriever`), cut from

* ``kg: record``: the record's own graph (G-Retriever's setting on RoG's pre-cut WebQSP/CWQ subgraphs);
* ``kg: embedded``: the embedded benchmark's whole KG (the KG-Guard setting of ``configs/detector_kaping.yaml``);
* ``kg: <file>``: a triples file (``.tsv`` / ``.parquet``, :func:`~kglightning.data.sources.triples.load_kg`, index
  cached), for the records of a user's own KG.

The cut records are cached as RoG ``.jsonl`` (with the subgraph statistics beside them), keyed by the dataset and the
retriever's settings, so the cut happens once and can be inspected. A question none of whose topic entities is in the
KG is kept with an empty graph (the methods abstain on it), counted and logged, so the evaluated questions stay the
same with and without PCST.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from kglightning.data.kg import KGIndex
from kglightning.data.records import KGQARecord
from kglightning.data.sources.loaders import read_records, write_records
from kglightning.data.store.cache import content_digest, untrusted, untrusted_above
from kglightning.data.store.cache_marks import adopt, damage, entry_holding, mark_file, set_aside, touch
from kglightning.fileio import write_text_atomic
from kglightning.retrieval.pcst import PCSTRetriever

__all__ = ["PCSTSubgraphs"]

log = logging.getLogger(__name__)


class PCSTSubgraphs:
    """Replaces every record's graph by its PCST subgraph (see the module docstring).

    Args:
        retriever: the PCST settings (default: G-Retriever's, with the bundled MiniLM encoder).
        kg: where subgraphs are cut from: ``"record"``, ``"embedded"`` or the path of a triples file.
        use_cache: read and write the cut records under the data module's cache root (``pcst_subgraphs/``).

    Example:
        >>> import tempfile
        >>> from kglightning.data.embeddings import SentenceEncoder
        >>> record = KGQARecord("q1", "Which river flows through the capital of France?", ["Seine"], ["France"],
        ...     ["Seine"], [("France", "capital", "Paris"), ("Paris", "river", "Seine"), ("France", "currency", "Euro"),
        ...             ("France", "language", "French")])
        >>> retriever = PCSTRetriever(SentenceEncoder(show_progress=False), cache_dir=tempfile.mkdtemp(), topk=2,
        ...                           topk_e=2, show_progress=False)
        >>> [cut] = PCSTSubgraphs(retriever).apply([record])
        >>> cut.graph, cut.extra["answer_in_graph"]
        ([('France', 'capital', 'Paris'), ('Paris', 'river', 'Seine')], True)
    """

    def __init__(self, retriever: PCSTRetriever | None = None, kg: str = "record", use_cache: bool = True) -> None:
        if not kg:
            raise ValueError("kg must be 'record', 'embedded' or the path of a triples file")
        if kg not in ("record", "embedded") and not Path(kg).is_file():
            raise FileNotFoundError(f"PCSTSubgraphs: kg {kg!r} is neither 'record', 'embedded' nor a triples file")
        self.retriever = retriever or PCSTRetriever()
        self.kg = kg
        self.use_cache = use_cache
        self._index: KGIndex | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kg={self.kg!r}, retriever={self.retriever!r})"

    @property
    def cache_key(self) -> str:
        """A short hash of the KG source (a triples file by the digest of its bytes) and the retriever's settings."""
        source = self.kg
        if self.kg == "embedded":  # rebuilt from packaged data: its version says which
            from kglightning.data.sources.embedded import VERSION

            source = f"embedded-v{VERSION}"
        elif self.kg != "record":
            source = f"{Path(self.kg).resolve()}:{content_digest(self.kg)}"
        ident = f"{source}|{self.retriever!r}|{self.retriever.num_clusters}|{self.retriever.encoder.cache_key}"
        return hashlib.sha1(ident.encode()).hexdigest()[:12]

    def index(self) -> KGIndex | None:
        """The whole KG the subgraphs are cut from (``None`` for ``kg: record``), built or loaded once."""
        if self.kg == "record":
            return None
        if self._index is None:
            if self.kg == "embedded":
                from kglightning.retrieval.build_subgraphs import embedded_kg

                self._index = embedded_kg()
            else:
                from kglightning.data.sources.triples import load_kg

                self._index = load_kg(self.kg)
        return self._index

    def apply(self, records: Sequence[KGQARecord], cache_file: str | Path | None = None) -> list[KGQARecord]:
        """The records with PCST graphs, read from ``cache_file`` when it exists and written there otherwise. The
        cache is used only in a folder that :func:`~kglightning.data.store.cache.untrusted` passes (else the graphs
        are cut and not kept, with a WARNING), and a file there is read only when it passes too (else it is set
        aside and cut again); a damaged file (cut short, a line that is not a valid record) is set aside and cut
        again too, with a WARNING, while an error of the system (no memory, no file handles) is raised as it is."""
        path = Path(cache_file) if cache_file is not None and self.use_cache else None
        path = path if path is not None and _usable(path) else None
        stats_path = None if path is None else path.with_suffix(".stats.json")
        cached = _read_cut(path) if path is not None and path.is_file() else None
        if path is not None and cached is not None:
            if [r.id for r in cached] == [r.id for r in records]:
                log.info("PCST subgraphs read from %s", path)
                for p in (path, stats_path):  # cache entries (when they are): a cut of a release before markers is
                    if entry_holding(p) == p:  # marked now; their use is what `kglightning cache clean` removes last
                        adopt(p)
                    touch(p)
                return cached
            log.warning("%s does not hold the same questions; cutting the subgraphs again", path)
        retriever = self.retriever
        retriever.stats = type(retriever.stats)()
        out = list(retriever.retrieve_records(records, self.index(), f"PCST subgraphs ({self.kg})", keep_skipped=True))
        summary = retriever.stats.summary()
        log.info("PCST subgraphs: %s", summary)
        if path is not None and stats_path is not None:
            for p in (path, stats_path):  # files of a cache's kind folder (pcst_subgraphs/): kglightning's marker
                if entry_holding(p) == p:
                    mark_file(p)
            write_records(out, path)
            stats = {"kg": self.kg, "retriever": repr(retriever), **summary}
            write_text_atomic(stats_path, json.dumps(stats, indent=2))
            os.chmod(stats_path, 0o644)  # whatever the umask: no file of the cache is writable by others
        return out


def _read_cut(path: Path) -> list[KGQARecord] | None:
    """The records of the cached cut ``path``, or ``None`` when it is damaged (cut short, not JSON, a record that
    fails validation: :func:`~kglightning.data.store.cache_marks.damage`), which is set aside (with a WARNING) to
    be cut again; an error of the system (no memory, no file handles, an I/O error) is raised as it is."""
    try:
        return list(read_records(path))
    except Exception as err:
        if not damage(err):
            raise
        set_aside(path, f"cannot be read as PCST subgraphs ({type(err).__name__}: {err})")
        return None


def _usable(path: Path) -> bool:
    """Whether the cache file ``path`` may be read and written: its folder passes
    :func:`~kglightning.data.store.cache.untrusted` (else ``False``, with a WARNING); a file at ``path`` that does
    not pass is set aside (:func:`~kglightning.data.store.cache_marks.set_aside`), and the subgraphs cut again."""
    try:
        why = untrusted_above(path.parent)
    except OSError as err:
        why = str(err)
    if why is not None:
        log.warning("PCST subgraph cache %s is not used (%s); the subgraphs are cut and not kept", path, why)
        return False
    try:
        why = untrusted(path) if os.path.lexists(path) else None
    except OSError as err:  # a link to nowhere
        why = str(err)
    if why is not None:
        set_aside(path, f"is not trusted ({why})")
    return True
