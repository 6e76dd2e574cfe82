"""Large record files read once: the validated records kept on disk as Arrow, their graphs memory-mapped.

Parsing and validating a RoG file is the slowest step of a run at full size (CWQ's training split is 7 GB of jsonl;
BENCHMARKS.md times its first and second read) and its graphs are most of the memory a run holds. So the first
:func:`~kglightning.data.sources.loaders.read_records` of a local file (of at least
``KGLIGHTNING_RECORD_STORE_MIN_MB`` MB, default 0: every file) writes what it read to
``$KGLIGHTNING_CACHE/records/<key>/``, as Apache Arrow IPC streams written with ordinary file writes (the format of
``datasets``' cache files), and gives back the records as the store holds them, as every later read does:

* ``records.arrow``: one row per record: ``id``, ``question``, ``answer``, ``q_entity``, ``a_entity``,
  ``prediction``, ``confidence`` and ``prediction_paths`` as Arrow strings and lists, ``graph`` as a list of
  ``[h, r, t]`` ``int32`` ids into the vocabulary, ``extra`` as JSON text;
* ``vocab.arrow``: the split's strings, one ``large_string`` column (``string``), in id order;
* ``meta.json``: what the read skipped and counted.

Nothing in the store is executable (no pickle). A store is read only after it is checked: its files must be this
user's and writable by no one else (:func:`~kglightning.data.store.cache.untrusted`; a ``records`` folder that fails
it is not used at all), and each Arrow table passes a full validation (offsets, lengths, UTF-8) and its graph ids a
range check before a value is read, so that a damaged or planted file cannot crash the process. A store that fails
a check is moved aside (``<key>.unreadable-<time>``, with a WARNING) and written again. The files open with any Arrow reader, e.g. ``datasets.Dataset.from_file(".../records.arrow")``,
``pyarrow.ipc.open_stream(...).read_pandas()``, or DuckDB over that table (see the data guide).

The key is the file's *content* (a BLAKE2 digest, remembered per path and ``stat`` stamp so that an unchanged file
is not hashed again), :data:`FORMAT`, :data:`~kglightning.data.records.VALIDATION_VERSION`, ``on_bad_record`` and
``limit`` (and ``split`` for a ``.json`` file, the one local format that holds several): touching or copying a file
finds the same store. A dataset folder is keyed by the bytes of its files, a hub dataset (``hf:``) by its
``datasets`` fingerprint (:func:`dataset_store_folder`). Later reads load the store: the graphs (:class:`~kglightning.data.triple_array.TripleArray`)
are views of a read-only memory map of ``records.arrow``, and the vocabulary stays in Arrow's flat buffers
(:meth:`~kglightning.data.triple_array.Vocab.from_arrow`), so a question's triples are read from disk when a stage
first looks at them and can be paged out again (the check at load reads them once and gives the pages back). A store
file under :data:`MAP_FROM_BYTES` is read into memory instead and stays resident like parsed records, so that the
records of many small files hold no file descriptors. ``KGLIGHTNING_RECORD_STORE_MIN_MB=off`` (or ``inf``) turns
the store off.
The store's files are never written in place (a changed file is a new store), so records read earlier keep their
graphs; a file someone rewrites in place under a running process changes that process's graphs.

A store is written into ``.<key>.kgl-<host>.<pid>.tmp``, which holds kglightning's marker from the moment it is made
(:mod:`~kglightning.data.store.cache_marks`), and renamed when whole; a writer first removes the temporary folders
that killed writers left for its key (:func:`~kglightning.data.store.temporaries.writer_temporary`). A write that
fails (a full disk, a value JSON cannot hold) leaves nothing behind and the records are returned as read, with a
warning. The cache folders are created ``0700`` (the cache root too, whatever the folder above it; an existing root
or ``records`` folder that another user owns or can write is not used) and the files ``0600``. A load records the
use on the marker (:func:`~kglightning.data.store.cache_marks.touch`), so that ``kglightning cache clean
--older-than`` counts it; a store that passes every check but carries no marker (written before markers existed)
is marked then (:func:`~kglightning.data.store.cache_marks.adopt`).

When several processes read a new file at once, one parses it and writes the store while the others wait
(:func:`~kglightning.data.store.record_lock.first_reader`).
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import shutil
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

import numpy as np

from kglightning.data.records import VALIDATION_VERSION, KGQARecord, RecordError
from kglightning.data.store.cache import (
    content_digest,
    default_cache_root,
    private_dir,
    untrusted,
    untrusted_above,
    warn_once,
)
from kglightning.data.store.cache_marks import adopt, mark_folder, set_aside, system_error, touch
from kglightning.data.store.mapped_pages import release_array
from kglightning.data.store.temporaries import writer_temporary
from kglightning.data.triple_array import TripleArray, Vocab

__all__ = [
    "content_digest",
    "dataset_store_folder",
    "load_store",
    "set_store_aside",
    "save_store",
    "store_folder",
    "system_error",
]

log = logging.getLogger(__name__)

FORMAT = 3  # 3: Arrow IPC streams, keyed by content (2: npy + pickle, keyed by path and stat)
_BATCH_RECORDS, _BATCH_TRIPLES = 1024, 1 << 22  # a record batch ends at whichever comes first


def _min_bytes() -> int | None:
    """``KGLIGHTNING_RECORD_STORE_MIN_MB`` in bytes; ``None`` for ``off`` (or an infinite size: no file is stored).

    Raises:
        ValueError: a value that is not ``off`` nor a number of MB >= 0 (``nan``, ``-1``, ``5MB``).
    """
    value = os.environ.get("KGLIGHTNING_RECORD_STORE_MIN_MB", "0").strip().lower()
    if value in ("off", "none", "no", "false"):
        return None
    try:
        mb = float(value)
    except ValueError:
        mb = math.nan
    if not mb >= 0:
        raise ValueError(f"KGLIGHTNING_RECORD_STORE_MIN_MB={value!r}: expected a number of MB >= 0, or 'off'")
    return None if math.isinf(mb) or mb * 2**20 >= 2**62 else int(mb * 2**20)


def _root() -> Path:
    """The record stores' kind folder; ``None`` (no store used) when it cannot be trusted (:func:`untrusted`: another
    user's, or writable by others), said once."""
    root = default_cache_root() / "records"
    try:  # the cache root is made 0700 when missing, whatever the folder above it; an existing one is checked
        why = untrusted_above(root)
    except OSError as err:
        why = str(err)
    if why is not None:
        warn_once("untrusted", root, "the record store folder %s is not used: %s", root, why, logger=log)
        return None
    return root


def store_folder(path: str | os.PathLike, split: str | None, on_bad_record: str, limit: int | None) -> Path | None:
    """Where the records of ``path`` read with these arguments are stored; ``None`` for a path the store does not
    keep (not a local file, smaller than the threshold, or the store turned off)."""
    if isinstance(path, str) and path.startswith("hf:"):
        return None
    p = Path(path)
    threshold = _min_bytes()
    if threshold is None or not p.is_file():
        return None
    if p.stat().st_size < threshold:
        return None
    split_key = split if p.suffix.lower() == ".json" else None  # .jsonl and .parquet hold one split
    root = _root()
    if root is None:
        return None
    fmt = p.suffix.lower()  # the parser is chosen by it: the same bytes as .json and .jsonl read differently
    ident = f"{FORMAT}|{VALIDATION_VERSION}|{content_digest(p)}|{fmt}|{split_key}|{on_bad_record}|{limit}"
    return root / hashlib.sha1(ident.encode()).hexdigest()[:16]


def dataset_store_folder(
    content: str, nbytes: int, split: str | None, on_bad_record: str, limit: int | None
) -> Path | None:
    """Where the records of a ``datasets`` split with this ``content`` key are stored: for a dataset folder
    (``save_to_disk``, or data files ``datasets`` loads) a digest of its files' bytes
    (:func:`~kglightning.data.store.cache.files_stamp`), for a hub dataset (``hf:``) its ``datasets`` fingerprint;
    ``None`` below the size threshold (``nbytes``, the folder's files or the split's Arrow data) or with the store
    turned off."""
    threshold = _min_bytes()
    root = None if threshold is None or nbytes < threshold or not content else _root()
    if root is None:
        return None
    ident = f"{FORMAT}|{VALIDATION_VERSION}|dataset:{content}|{split}|{on_bad_record}|{limit}"
    return root / hashlib.sha1(ident.encode()).hexdigest()[:16]


def _schema():
    import pyarrow as pa

    strings = pa.list_(pa.string())
    return pa.schema(
        [
            ("id", pa.string()),
            ("question", pa.string()),
            ("answer", strings),
            ("q_entity", strings),
            ("a_entity", strings),
            ("graph", pa.list_(pa.list_(pa.int32(), 3))),
            ("prediction", strings),
            ("confidence", pa.list_(pa.float64())),
            ("prediction_paths", pa.list_(pa.list_(strings))),
            ("extra", pa.string()),
        ]
    )


def _batch(records: list[KGQARecord], vocab: Vocab, schema):
    import pyarrow as pa

    parts = [
        r.graph.ids
        if isinstance(r.graph, TripleArray) and r.graph.vocab is vocab
        else vocab.ids(chain.from_iterable(r.graph)).reshape(-1, 3)
        for r in records
    ]
    offsets = np.zeros(len(parts) + 1, dtype=np.int32)
    np.cumsum([len(g) for g in parts], out=offsets[1:])
    flat = (
        np.concatenate([np.asarray(g, dtype=np.int32).reshape(-1) for g in parts]) if parts else np.zeros(0, np.int32)
    )
    graph = pa.ListArray.from_arrays(pa.array(offsets), pa.FixedSizeListArray.from_arrays(pa.array(flat), 3))
    extra = []
    for r in records:
        bad = _not_json(r.extra)
        if bad is not None:
            raise TypeError(f"record {r.id!r}: field 'extra' holds a value JSON cannot keep as it is ({bad})")
        extra.append(json.dumps(r.extra, ensure_ascii=False))
    cols = {
        "id": [r.id for r in records],
        "question": [r.question for r in records],
        "answer": [r.answer for r in records],
        "q_entity": [r.q_entity for r in records],
        "a_entity": [r.a_entity for r in records],
        "prediction": [r.prediction for r in records],
        "confidence": [r.confidence for r in records],
        "prediction_paths": [r.prediction_paths for r in records],
        "extra": extra,
    }
    arrays = [graph if f.name == "graph" else pa.array(cols[f.name], type=f.type) for f in schema]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _not_json(value: object) -> str | None:
    """What in ``value`` would not come back from JSON as it is (a tuple would come back a list, a timestamp not at
    all), or ``None``."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return None
    if isinstance(value, list):
        return next((b for b in map(_not_json, value) if b is not None), None)
    if isinstance(value, dict):
        if any(not isinstance(k, str) for k in value):
            return "a key that is not a string"
        return next((b for b in map(_not_json, value.values()) if b is not None), None)
    return f"a {type(value).__name__}"


def _chunks(records: list[KGQARecord]) -> Iterator[list[KGQARecord]]:
    chunk: list[KGQARecord] = []
    triples = 0
    for r in records:
        chunk.append(r)
        triples += len(r.graph)
        if len(chunk) >= _BATCH_RECORDS or triples >= _BATCH_TRIPLES:
            yield chunk
            chunk, triples = [], 0
    if chunk:
        yield chunk


def save_store(records: list[KGQARecord], folder: Path) -> None:
    """Write ``records`` (a :class:`~kglightning.data.sources.loaders.RecordList`) to ``folder``, whole or not at
    all: into a temporary folder first, then renamed. Raises what the write raised (nothing is left behind)."""
    import pyarrow as pa

    vocab: Vocab = getattr(records, "vocab", None) or Vocab()
    private_dir(folder.parent)
    tmp = writer_temporary(folder, "a record store writer")
    tmp.mkdir(mode=0o700)
    try:
        mark_folder(tmp)  # kglightning's from the start: `kglightning cache clean` may remove it, killed or whole
        schema = _schema()
        n = triples = 0
        with pa.OSFile(str(tmp / "records.arrow"), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for chunk in _chunks(records):  # batch by batch: no second copy of the split's graphs in memory
                writer.write_batch(_batch(chunk, vocab, schema))
                n += len(chunk)
                triples += sum(len(r.graph) for r in chunk)
        strings = vocab.to_arrow()  # after the batches: they may add the strings of graphs given as tuples
        table = pa.table({"string": strings})
        with pa.OSFile(str(tmp / "vocab.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        meta = {
            "format": FORMAT,
            "validation": VALIDATION_VERSION,
            "source": getattr(records, "source", "<memory>"),
            "split": getattr(records, "split", None),
            "skipped": [[e.reason, e.source, e.line, e.field] for e in getattr(records, "skipped", [])],
            "empty_graph": getattr(records, "empty_graph", []),
            "unknown_topic": getattr(records, "unknown_topic", []),
            "records": n,
            "triples": triples,
            "strings": len(strings),
        }
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        for name in ("records.arrow", "vocab.arrow", "meta.json"):
            os.chmod(tmp / name, 0o600)  # whatever the umask: a store others can write is not read
        if folder.is_dir() and not (folder / "meta.json").exists():  # torn (or not a store): never read, moved aside
            set_aside(folder, "holds no meta.json")
        try:
            os.replace(tmp, folder)
        except OSError as err:
            if err.errno not in (errno.ENOTEMPTY, errno.EEXIST) or not (folder / "meta.json").is_file():
                raise  # not another process's whole store: a real failure
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


#: store files from this size on are memory-mapped; smaller ones are read into memory: a map holds a file descriptor
#: for as long as the records live, and a run may hold the records of hundreds of small files
MAP_FROM_BYTES = 16 * 2**20


def _mapped(path: Path) -> tuple[np.ndarray, object]:
    """The bytes of an Arrow stream file, a read-only memory map from :data:`MAP_FROM_BYTES` on (else read into
    memory), and its reader over them (zero-copy)."""
    import pyarrow as pa

    if path.stat().st_size >= MAP_FROM_BYTES:
        raw = np.memmap(path, dtype=np.uint8, mode="r")
    else:
        raw = np.fromfile(path, dtype=np.uint8)
        raw.flags.writeable = False
    return raw, pa.ipc.open_stream(pa.py_buffer(raw))


def _triples(raw: np.ndarray, graph) -> np.ndarray:
    """The ``(n, 3)`` ``int32`` triples of a batch's ``graph`` column, as a view of ``raw`` (so that
    :func:`~kglightning.data.store.mapped_pages.release_array` can give their pages back when it is a map)."""
    fixed = graph.values
    values = fixed.values
    buf = values.buffers()[1]
    if buf is None or buf.size == 0:  # only empty graphs in this batch: Arrow maps no buffer for them
        return np.zeros((0, 3), dtype=np.int32)
    start = buf.address - raw.ctypes.data
    if not 0 <= start <= raw.size - buf.size or start % 4:
        raise ValueError("the graph column is not an aligned part of the mapped file")
    ids = raw[start : start + buf.size].view(np.int32)[values.offset :]
    return ids[: 3 * (fixed.offset + len(fixed))].reshape(-1, 3)[fixed.offset :]


def _check_trusted(folder: Path) -> None:
    """Raise ``ValueError`` when a file of the store could have been written by another user
    (:func:`~kglightning.data.store.cache.untrusted`: the store's folder, those above it up to the cache root, and
    its files must be this user's and writable by no one else)."""
    why = untrusted(folder / "meta.json")
    for name in ("records.arrow", "vocab.arrow"):
        why = why or untrusted(folder / name, alone=True)
    if why is not None:
        raise ValueError(f"not trusted: {why}")


def _checked(batch, schema, n_strings: int, raw: np.ndarray):
    """``batch`` after a full Arrow validation (offsets, lengths and UTF-8 checked before any value is read: a
    damaged offset would otherwise crash the process) and a check that its graph ids name strings of the vocabulary;
    raises ``ValueError`` for a batch that fails either."""
    import pyarrow as pa

    if not batch.schema.equals(schema):
        raise ValueError(f"records.arrow has the schema {batch.schema}, not the record store's")
    try:
        batch.validate(full=True)
    except pa.ArrowException as err:
        raise ValueError(f"records.arrow is damaged ({err})") from err
    triples = _triples(raw, batch.column("graph"))
    if triples.size and (int(triples.min()) < 0 or int(triples.max()) >= n_strings):
        raise ValueError(f"records.arrow holds graph ids outside the {n_strings} strings of vocab.arrow")
    return batch, triples


def load_store(folder: Path, out: list, source: str | None = None) -> None:
    """Fill ``out`` (an empty :class:`~kglightning.data.sources.loaders.RecordList`) with the records
    :func:`save_store` wrote to ``folder``, their graphs views of a memory map; ``source`` (the path being read)
    replaces the one stored, in ``out.source`` and in the skipped records' errors.

    The store is checked before anything in it is used: its files must be this user's and writable by no one else
    (:func:`~kglightning.data.store.cache.untrusted`), each Arrow table passes a full validation, and every graph id
    must name a string of the vocabulary (reading the graphs once; the pages of a mapped file are given back).

    Raises:
        ValueError: a store that fails a check, is torn, or is of another format (the caller sets it aside).
        OSError: a file that cannot be read now (with an ``errno``: the system), or, without one, an Arrow stream
            cut short (pyarrow's format error: the store is damaged).
    """
    import pyarrow as pa

    _check_trusted(folder)
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT or meta.get("validation") != VALIDATION_VERSION:
        raise ValueError(f"{folder}: record store format {meta.get('format')}/{meta.get('validation')}, expected "
                         f"{FORMAT}/{VALIDATION_VERSION}")  # fmt: skip
    stored_source = meta["source"]
    out.source, out.split = source or stored_source, meta["split"]
    _, vocab_reader = _mapped(folder / "vocab.arrow")
    strings = vocab_reader.read_all()
    try:
        strings.validate(full=True)
    except pa.ArrowException as err:
        raise ValueError(f"vocab.arrow is damaged ({err})") from err
    if strings.schema.names != ["string"] or not pa.types.is_large_string(strings.schema.field(0).type):
        raise ValueError(f"vocab.arrow has the schema {strings.schema}, not one large_string column 'string'")
    vocab = Vocab.from_arrow(strings.column("string"))
    out.vocab = vocab
    raw, reader = _mapped(folder / "records.arrow")
    schema = _schema()
    for batch in reader:
        batch, triples = _checked(batch, schema, len(vocab), raw)
        offsets = batch.column("graph").offsets.to_numpy()
        cols = {name: batch.column(name).to_pylist() for name in schema.names if name != "graph"}
        for i in range(batch.num_rows):
            out.append(
                KGQARecord(
                    cols["id"][i],
                    cols["question"][i],
                    cols["answer"][i],
                    cols["q_entity"][i],
                    cols["a_entity"][i],
                    TripleArray.view(triples[offsets[i] : offsets[i + 1]], vocab),
                    cols["prediction"][i],
                    cols["confidence"][i],
                    json.loads(cols["extra"][i]),
                    cols["prediction_paths"][i],
                )  # fmt: skip
            )
    release_array(raw)  # the check read every graph: their pages are given back until a stage looks at them
    if len(out) != meta["records"] or len(vocab) != meta["strings"]:
        raise ValueError(f"{folder}: {len(out)} records and {len(vocab)} strings where {meta['records']} and "
                         f"{meta['strings']} were stored")  # fmt: skip
    adopt(folder)  # trusted and whole: a store written before markers existed is marked now, so clean can see it
    touch(folder)  # used now: what `kglightning cache clean --older-than` removes last
    where = out.source
    out.skipped = [
        RecordError(m, source=where if s == stored_source else s, line=ln, field=fd) for m, s, ln, fd in meta["skipped"]
    ]
    out.empty_graph, out.unknown_topic = meta["empty_graph"], meta["unknown_topic"]
    out.store = folder


def set_store_aside(folder: Path, why: str) -> None:
    """Move a store that could not be read or trusted out of the way, with a WARNING
    (:func:`~kglightning.data.store.cache_marks.set_aside`); the next read writes it again."""
    set_aside(folder, why)
