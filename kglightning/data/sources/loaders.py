"""Read and write KGQA records (RoG schema) from local files, saved datasets and the HF hub.

:func:`read_records` accepts

* ``.jsonl``: one record per line (blank lines ignored; errors give the 1-based line);
* ``.json``: a list of records, or an object with the list under the split name or under ``"data"``;
* ``.parquet``: one record per row (errors give the 0-based row);
* a directory written by ``datasets.Dataset.save_to_disk`` / ``DatasetDict.save_to_disk``;
* a local directory laid out like a HF hub dataset snapshot (``data/train-00000-of-00001.parquet``, as
  ``rmanluo/RoG-webqsp`` is stored), read with ``datasets.load_dataset(directory, split=...)``;
* ``"hf:owner/name"``: ``datasets.load_dataset("owner/name", split=...)``. This needs network access (or a
  populated HF cache); everything else is read locally.

Every record is validated by :meth:`KGQARecord.from_dict`; a repeated ``id`` is an error too. With
``on_bad_record="raise"`` the first :class:`RecordError` propagates (it names file, line and field); with ``"skip"``
each bad record is logged once at WARNING with its reason, followed by one summary WARNING. Nothing is dropped
silently.

Two soft problems are *not* errors: a record with an empty ``graph``, and a record whose topic entities
(``q_entity``) do not all occur in its graph ("unknown topic entity"). Such records are kept and counted;
downstream components treat them as having no evidence (retrievers abstain) rather than crashing.

A record read here holds its graph as a :class:`~kglightning.data.triple_array.TripleArray`: ``int32`` ids over
strings that all the records of the :class:`RecordList` share (about 12 bytes a triple, not 300), which reads,
iterates and compares as the list of ``(head, relation, tail)`` tuples it stands for.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.sources.json_lines import iter_json_lines
from kglightning.data.store.cache import files_stamp, folder_files, warn_once
from kglightning.data.store.owned_files import create_new
from kglightning.data.store.record_lock import first_reader
from kglightning.data.store.record_store import (
    dataset_store_folder,
    load_store,
    save_store,
    set_store_aside,
    store_folder,
    system_error,
)
from kglightning.data.store.temporaries import writer_temporary
from kglightning.data.triple_array import Vocab, graph_nodes

logger = logging.getLogger(__name__)

SUPPORTED_FORMATS = (
    ".jsonl, .json, .parquet, a datasets.save_to_disk directory, a directory of parquet files laid out like a HF "
    "hub dataset (data/<split>-*.parquet), or 'hf:owner/name'"
)
HF_PREFIX = "hf:"
_BATCH = 256


class RecordList(list):
    """A ``list[KGQARecord]`` that remembers where it came from and what was skipped or looked odd.

    Attributes:
        source: the path (or ``hf:`` name) the records were read from.
        split: the split that was selected, if any.
        skipped: one :class:`RecordError` per skipped record (``on_bad_record="skip"``).
        empty_graph: ids of kept records whose ``graph`` is empty.
        unknown_topic: ids of kept records with a non-empty graph in which some ``q_entity`` name does not occur
            (or whose ``q_entity`` is empty).
        store: the record store folder the records were loaded from (:mod:`~kglightning.data.store.record_store`),
            or ``None``. Its ``records.arrow`` (one row per record, the graphs as ``int32`` id triples) and
            ``vocab.arrow`` (the strings the ids index) open with any Arrow reader, e.g.
            ``datasets.Dataset.from_file(str(records.store / "records.arrow"))``; they hold the records as read,
            not changes made to this list since.
    """

    def __init__(self, records: Iterable[KGQARecord] = (), *, source: str = "<memory>", split: str | None = None):
        super().__init__(records)
        self.source = source
        self.split = split
        self.skipped: list[RecordError] = []
        self.vocab = Vocab()  # the strings of the graphs read into this list (records keep ids: TripleArray)
        self.empty_graph: list[str] = []
        self.unknown_topic: list[str] = []
        self.store: Path | None = None

    def count_graph_issues(self) -> RecordList:
        """Fill :attr:`empty_graph` and :attr:`unknown_topic` from the records as they are now (e.g. after a
        subgraph cut); returns ``self``."""
        self.empty_graph, self.unknown_topic = [], []
        for rec in self:
            if not rec.graph:
                self.empty_graph.append(rec.id)
            else:
                nodes = graph_nodes(rec.graph)
                if not rec.q_entity or any(q not in nodes for q in rec.q_entity):
                    self.unknown_topic.append(rec.id)
        return self

    @property
    def num_read(self) -> int:
        """Records kept plus records skipped."""
        return len(self) + len(self.skipped)

    def summary(self) -> str:
        """One line: counts of kept, skipped, empty-graph and unknown-topic records.

        Example:
            >>> RecordList(source="x.jsonl").summary()
            'x.jsonl: 0 records kept, 0 skipped, 0 with an empty graph, 0 with an unknown topic entity'
        """
        where = self.source if self.split is None else f"{self.source} [{self.split}]"
        return (
            f"{where}: {len(self)} records kept, {len(self.skipped)} skipped, {len(self.empty_graph)} with an "
            f"empty graph, {len(self.unknown_topic)} with an unknown topic entity"
        )


def _iter_jsonl(path: Path, source: str) -> Iterator[tuple[int, Any]]:
    """``(line, value or RecordError)``: a line that cannot be read (not UTF-8, not JSON, a number too long, nesting
    too deep) is yielded as its error, so that ``on_bad_record="skip"`` skips and counts it."""
    return iter_json_lines(path, source)


def _iter_json(path: Path, source: str, split: str | None) -> Iterator[tuple[int, Any]]:
    try:
        with open(path, encoding="utf-8-sig") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise RecordError(f"invalid JSON: {e.msg} (column {e.colno})", source=source, line=e.lineno) from None
    except RecursionError:
        raise RecordError("invalid JSON: nested too deeply to read", source=source) from None
    except ValueError as e:  # an integer past sys.get_int_max_str_digits()
        raise RecordError(
            f"invalid JSON: a number that cannot be read ({str(e).split(':')[0]})", source=source
        ) from None
    if isinstance(data, dict):
        key = split if split is not None and split in data else "data" if "data" in data else None
        if key is None:
            keys = ", ".join(map(repr, list(data)[:10]))
            want = f"split {split!r} or " if split is not None else ""
            raise RecordError(
                f"expected a list of records, or an object with {want}'data' (keys: {keys})", source=source
            )
        data = data[key]
    if not isinstance(data, list):
        raise RecordError(f"expected a list of records, got {type(data).__name__}", source=source)
    yield from enumerate(data)


def _iter_parquet(path: Path) -> Iterator[tuple[int, Any]]:
    import pyarrow.parquet as pq

    row = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=_BATCH):
        for rec in batch.to_pylist():  # nested lists come back as plain Python lists
            yield row, rec
            row += 1


def _pick_split(data: Any, split: str | None, source: str) -> tuple[Any, str | None]:
    """Select ``split`` from a ``DatasetDict`` (or the only split when ``split`` is ``None``)."""
    from datasets import DatasetDict, IterableDatasetDict

    if not isinstance(data, (DatasetDict, IterableDatasetDict)):
        return data, split
    names = list(data)
    if split is None and len(names) == 1:
        split = names[0]
    if split is None:
        raise RecordError(f"holds several splits, choose one with split=...: {names}", source=source)
    if split not in data:
        raise RecordError(f"has no split {split!r}; available splits: {names}", source=source)
    return data[split], split


def _iter_dataset(ds: Any) -> Iterator[tuple[int, Any]]:
    if hasattr(ds, "with_format") and hasattr(ds, "__len__"):  # map-style Dataset: convert in arrow batches
        row = 0
        for table in ds.with_format("arrow").iter(batch_size=_BATCH):
            for rec in table.to_pylist():
                yield row, rec
                row += 1
    else:  # IterableDataset (streaming)
        yield from enumerate(ds)


@functools.lru_cache(maxsize=64)
def hub_fingerprint(path: str, split: str | None) -> str:
    """The ``datasets`` fingerprint of ``hf:owner/name`` (its ``split``, or every split): it changes with the data
    (another revision downloaded), so caches of work derived from the records can key on it. Read from the local
    ``datasets`` cache once downloaded, and once per process."""
    import datasets

    loaded = datasets.load_dataset(path[len(HF_PREFIX) :], split=split)
    if isinstance(loaded, datasets.DatasetDict):
        return ",".join(f"{k}={v._fingerprint}" for k, v in sorted(loaded.items()))
    return str(loaded._fingerprint)


def _is_dataset(path: str | os.PathLike) -> bool:
    return (isinstance(path, str) and path.startswith(HF_PREFIX)) or Path(path).is_dir()


def _open_dataset(path: str | os.PathLike, split: str | None) -> tuple[str, Any, str | None]:
    """``(source, dataset split, split name)`` of a hub dataset or a dataset folder."""
    import datasets

    if isinstance(path, str) and path.startswith(HF_PREFIX):
        ds, split = _pick_split(datasets.load_dataset(path[len(HF_PREFIX) :], split=split), split, path)
        return path, ds, split
    p, source = Path(path), str(path)
    if (p / "dataset_dict.json").exists() or (p / "state.json").exists():
        loaded = datasets.load_from_disk(str(p))
    elif any(p.rglob("*.parquet")) or any(p.rglob("*.jsonl")) or any(p.rglob("*.json")):
        # all splits, then pick (one error message for both cases); prepared again from the files, not taken from
        # the datasets cache, which knows files by their modification time and would give a file changed in place
        # (its time set back) as it was
        loaded = datasets.load_dataset(str(p), download_mode="force_redownload")
    else:
        raise ValueError(f"{source}: directory holds no dataset (supported inputs: {SUPPORTED_FORMATS})")
    ds, split = _pick_split(loaded, split, source)
    return source, ds, split


def _open(path: str | os.PathLike, split: str | None) -> tuple[str, Iterator[tuple[int, Any]], str | None]:
    """Resolve ``path`` to ``(source, iterator of (line, raw record or RecordError), split)``."""
    if _is_dataset(path):  # a hub dataset or a dataset folder
        source, ds, split = _open_dataset(path, split)
        return source, _iter_dataset(ds), split
    p = Path(path)
    source = str(path)
    if not p.exists():
        raise FileNotFoundError(f"{source}: no such file or directory (supported inputs: {SUPPORTED_FORMATS})")
    suffix = p.suffix.lower()
    if suffix == ".jsonl":
        return source, _iter_jsonl(p, source), split
    if suffix == ".json":
        return source, _iter_json(p, source, split), split
    if suffix == ".parquet":
        return source, _iter_parquet(p), split
    what = repr(suffix) if suffix else "(no suffix)"
    raise ValueError(f"{source}: unsupported format {what} (supported inputs: {SUPPORTED_FORMATS})")


def read_records(
    path: str | os.PathLike,
    *,
    split: str | None = None,
    on_bad_record: Literal["raise", "skip"] = "raise",
    limit: int | None = None,
    report: bool = True,
) -> RecordList:
    """Read and validate KGQA records (see the module docstring for the formats).

    Args:
        path: a ``.jsonl``/``.json``/``.parquet`` file, a dataset directory, or ``"hf:owner/name"`` (network).
        split: which split to take from a ``DatasetDict``, a hub-style directory, ``hf:`` or a ``.json`` object;
            may be left out when there is only one.
        on_bad_record: ``"raise"`` the first :class:`RecordError`, or ``"skip"`` bad records (each logged at
            WARNING, plus a summary; they are listed in :attr:`RecordList.skipped`).
        limit: stop once this many valid records are kept.
        report: log the summary WARNINGs (skipped records, empty graphs, unknown topics); ``False`` for files the
            toolkit wrote itself from records it already reported (caches).

    Returns:
        The records, in file order, as a :class:`RecordList`. Records with an empty graph or an unknown topic
        entity are kept (downstream, retrievers abstain on them) and counted in ``empty_graph`` / ``unknown_topic``.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: unsupported format.
        RecordError: a bad record (in ``"raise"`` mode), or a file that cannot be read at all.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "q.jsonl")
        >>> with open(p, "w") as f:
        ...     _ = f.write('{"id": "q1", "question": "capital of France?", "answer": ["Paris"], "q_entity": '
        ...                 '["France"], "a_entity": ["Paris"], "graph": [["France", "capital", "Paris"]]}\\n')
        >>> recs = read_records(p)
        >>> len(recs), recs[0].a_entity, recs.skipped
        (1, ['Paris'], [])
    """
    if on_bad_record not in ("raise", "skip"):
        raise ValueError(f"on_bad_record must be 'raise' or 'skip', got {on_bad_record!r}")
    folder = store_folder(path, split, on_bad_record, limit)
    opened = None
    if folder is None and _is_dataset(path):  # a hub dataset is opened once: for its fingerprint, and to read it
        opened, folder = _dataset_folder(path, split, on_bad_record, limit)
    out = _stored(folder, path, split) if folder is not None else None
    if out is None and folder is not None:
        with first_reader(folder, path) as state:  # one process parses a new large file; the others load its store
            out = _stored(folder, path, split) if state != "unlocked" else None
            if out is None and state == "first":
                out = _read_and_store(path, split, on_bad_record, limit, folder, opened)
    if out is None:  # no store, or the process that held the lock wrote none
        out = _read_and_store(path, split, on_bad_record, limit, folder, opened)
    if report:
        _log_summary(out)
    return out


def _read_and_store(
    path: str | os.PathLike,
    split: str | None,
    on_bad_record: str,
    limit: int | None,
    folder: Path | None,
    opened: tuple[str, Any, str | None] | None = None,
) -> RecordList:
    out = _read(path, split, on_bad_record, limit, opened=opened).count_graph_issues()
    if folder is not None:
        try:
            save_store(out, folder)
        except Exception as err:  # a full or read-only cache, a value JSON cannot hold: go on without it
            where = folder.parent if isinstance(err, OSError) else folder  # a full or read-only cache: all of it
            warn_once("not kept", where, "could not keep the records of %s in %s (%s: %s); the next run reads the "
                      "file again", out.source, folder, type(err).__name__, err, logger=logger)  # fmt: skip
        else:  # the first read gives what every later one will: the records as the store holds them
            stored = _stored(folder, path, split, announce=False)
            if stored is not None:
                return stored
    return out


def _dataset_folder(
    path: str | os.PathLike, split: str | None, on_bad_record: str, limit: int | None
) -> tuple[tuple[str, Any, str | None] | None, Path | None]:
    """The store of a dataset folder's or a hub dataset's split, and the split opened when it had to be (``None``
    otherwise, or when it cannot be: the read says why). A dataset folder is keyed by the bytes of its files
    (:func:`~kglightning.data.store.cache.files_stamp`: a file changed in place, whatever its modification time,
    is another store; files in linked folders, a split folder that is a link, count as the reader sees them),
    without opening it; a hub dataset by its ``datasets`` fingerprint (``None`` for a streamed
    one, or below the threshold)."""
    if not (isinstance(path, str) and path.startswith(HF_PREFIX)):
        p = Path(path)
        size = sum(f.stat().st_size for _, f in folder_files(p)[0])  # links followed, as the key's walk does
        return None, dataset_store_folder(f"files:{files_stamp(p)}", size, split, on_bad_record, limit)
    try:
        opened = _open_dataset(path, split)
    except Exception:  # noqa: BLE001 (the read raises it again, with the file, the split and the reason)
        return None, None
    ds = opened[1]
    data = getattr(ds, "data", None)
    if data is None or not hasattr(ds, "_fingerprint"):
        return opened, None
    return opened, dataset_store_folder(f"hub:{ds._fingerprint}", int(data.nbytes), opened[2], on_bad_record, limit)


def _stored(folder: Path, path: str | os.PathLike, split: str | None, announce: bool = True) -> RecordList | None:
    """The records stored in ``folder`` (:mod:`~kglightning.data.store.record_store`), or ``None`` (none, or unreadable:
    moved out of the way, and the file is read again); ``announce`` logs where they came from (not on the first
    read, which has just written them)."""
    if not (folder / "meta.json").is_file():
        return None
    out = RecordList()
    try:
        load_store(folder, out, str(path))
        if Path(str(path)).suffix.lower() != ".json" and not _is_dataset(path):  # one split per file: the caller's
            out.split = split
    except (OSError, MemoryError) as err:
        if not system_error(err):  # the store's own damage, told as an OSError: set aside, and written again
            set_store_aside(folder, f"cannot be read as a record store ({type(err).__name__}: {err})")
            return None
        logger.warning("record store %s cannot be loaded now (%s: %s); reading the file", folder,
                       type(err).__name__, err)  # fmt: skip
        return None
    except Exception as err:  # a torn, damaged, foreign or untrusted store: set aside, and written again
        set_store_aside(folder, f"cannot be read as a record store ({type(err).__name__}: {err})")
        return None
    if announce:
        logger.info("read %d records of %s from %s", len(out), out.source, folder)
    return out


def read_questions(path: str | os.PathLike, *, split: str | None = None, limit: int | None = None) -> RecordList:
    """Read questions that have no subgraph yet (the input of a retriever), in any format of :func:`read_records`.

    Each row needs ``id``, ``question`` and ``q_entity`` (the topic entities, KG node names); ``answer`` and
    ``a_entity`` are optional (empty when left out) and a ``graph`` is ignored. Other keys are kept in ``extra``.

    Raises:
        RecordError: the first bad row (missing or malformed field, duplicate id), naming file, line and field.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "q.jsonl")
        >>> with open(p, "w") as f:
        ...     _ = f.write('{"id": "q1", "question": "capital of France?", "q_entity": "France"}\\n')
        >>> qs = read_questions(p)
        >>> qs[0].q_entity, qs[0].answer, qs[0].graph
        (['France'], [], [])
    """
    return _read(path, split, "raise", limit, as_question=True)


def _read(
    path: str | os.PathLike,
    split: str | None,
    on_bad_record: str,
    limit: int | None,
    as_question: bool = False,
    opened: tuple[str, Any, str | None] | None = None,
) -> RecordList:
    """Validated records in file order (``as_question``: no graph, default answers, a topic entity required);
    ``opened``: the dataset split :func:`_open_dataset` gave for ``path``, read instead of opening it again."""
    source, rows, split = _open(path, split) if opened is None else (opened[0], _iter_dataset(opened[1]), opened[2])
    out = RecordList(source=source, split=split)
    vocab = out.vocab
    first_seen: dict[str, int | None] = {}
    for line, raw in rows:
        if limit is not None and len(out) >= limit:
            break
        try:
            if isinstance(raw, RecordError):
                raise raw
            if as_question and isinstance(raw, dict):
                raw = {"answer": [], "a_entity": [], **raw, "graph": []}
            raw_id = raw.get("id") if isinstance(raw, dict) else None
            if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) and str(raw_id) in first_seen:
                vocab_now = None  # a repeated id is refused below: its graph's strings stay out of the vocabulary
            else:
                vocab_now = None if as_question else vocab
            rec = KGQARecord.from_dict(raw, source=source, line=line, vocab=vocab_now)
            if rec.id in first_seen:
                where = f"{'line' if source.endswith('.jsonl') else 'row'} {first_seen[rec.id]}"
                raise RecordError(
                    f"duplicate id {rec.id!r} (first seen at {where})", source=source, line=line, field="id"
                )
            if as_question and not rec.q_entity:
                raise RecordError("no topic entity: a retriever needs at least one", source=source, line=line,
                                  field="q_entity")  # fmt: skip
        except RecordError as err:
            if on_bad_record == "raise":
                raise
            out.skipped.append(err)
            logger.warning("skipping record: %s", err)
            continue
        first_seen[rec.id] = line
        out.append(rec)
    return out


def _log_summary(out: RecordList) -> None:
    if out.skipped:
        reasons = Counter(f"field '{e.field}'" if e.field else e.reason.split(":")[0] for e in out.skipped)
        why = ", ".join(f"{n} x {r}" for r, n in reasons.most_common())
        logger.warning("skipped %d of %d records from %s: %s", len(out.skipped), out.num_read, out.source, why)
    if out.empty_graph or out.unknown_topic:
        logger.warning(
            "%s: %d of %d records have an empty graph and %d have a topic entity missing from their graph; they are "
            "kept and treated as having no evidence",
            out.source,
            len(out.empty_graph),
            len(out),
            len(out.unknown_topic),
        )


def write_records(records: Iterable[KGQARecord | Mapping[str, Any]], path: str | os.PathLike) -> int:
    """Write records as UTF-8 ``.jsonl`` (non-ASCII kept as is), atomically: a temporary file
    (``.<name>.kgl-<host>.<pid>.tmp``), then ``os.replace``. A temporary that a killed writer left beside ``path`` is
    removed by the next write of ``path`` (:func:`~kglightning.data.store.temporaries.writer_temporary`): only one
    of that exact name, of this host whose process is gone and in which nothing was written for ten minutes, or of
    another host (with the ``kgl-`` token) in which nothing was written for a day; nothing else beside ``path`` is
    ever removed (a user's ``.preds.jsonl.backup.tmp`` is theirs).

    Args:
        records: :class:`KGQARecord` objects, or dicts (validated with :meth:`KGQARecord.from_dict` first).
        path: the ``.jsonl`` file to write; parent folders are created.

    Returns:
        The number of records written.

    Example:
        >>> import tempfile, os
        >>> r = KGQARecord("q1", "Où est Paris ?", ["France"], ["Paris"], ["France"], [("Paris", "in", "France")])
        >>> p = os.path.join(tempfile.mkdtemp(), "out.jsonl")
        >>> write_records([r], p), read_records(p)[0] == r
        (1, True)
    """
    p = Path(path)
    if p.suffix.lower() != ".jsonl":
        raise ValueError(f"{p}: write_records writes .jsonl only")
    p.parent.mkdir(parents=True, exist_ok=True)
    mode = p.stat().st_mode & 0o777 if p.exists() else 0o644  # the result's mode, whatever the umask
    tmp = writer_temporary(p, "a records writer")  # .<name>.kgl-<host>.<pid>.tmp: the next writer removes it if killed
    fd = create_new(tmp)  # a new file (0600 until the mode below), never written through a name someone prepared
    n = 0
    try:
        os.chmod(tmp, mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for rec in records:
                if not isinstance(rec, KGQARecord):
                    rec = KGQARecord.from_dict(rec, source="write_records", line=n)
                f.write(json.dumps(rec.to_dict(), ensure_ascii=False) + "\n")
                n += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n
