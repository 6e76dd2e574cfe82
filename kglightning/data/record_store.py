"""Large record files read once: the validated records kept on disk in binary form, their graphs memory-mapped.

Parsing and validating a RoG file is the slowest step of a run at full size (CWQ's training split, 7 GB of
jsonl, takes about 20 minutes on 2 cores) and its graphs are most of the memory a run holds. So the first
:func:`~kglightning.data.sources.loaders.read_records` of a local file of at least ``KGLIGHTNING_RECORD_STORE_MIN_MB``
(default 64) MB writes what it read to ``$KGLIGHTNING_CACHE/records/<key>/``:

* ``graphs.npy``: every graph's triples as one ``(n, 3)`` ``int32`` array over the split's vocabulary, and
  ``offsets.npy`` where each record's rows start;
* ``strings.json``: the vocabulary; ``records.pkl``: each record's other fields, pickled so that any value a
  parquet column holds (a timestamp, a map's tuples) comes back as it was read; ``meta.json``: what the read
  skipped and counted.

Later reads of the same file (same path, inode, size, modification and change times, same ``split``,
``on_bad_record`` and ``limit``, same kglightning version) load that folder instead: the graphs are views of a
memory map (:class:`~kglightning.data.triple_array.TripleArray` over ``numpy.load(mmap_mode="r")``), so a
question's triples are read from disk when a DataModule or a stage first looks at them and can be paged out again.
``KGLIGHTNING_RECORD_STORE_MIN_MB=off`` turns the store off.

When several processes read a new file at once (DDP ranks, a job array), :func:`first_reader` lets one parse it and
write the store while the others wait on ``<key>.lock`` and then load the store: the file is parsed once. A store
that exists is loaded without the lock. The wait is bounded (``KGLIGHTNING_RECORD_STORE_WAIT_S``, default 7200 s,
``0`` for no lock; a WARNING every 10 minutes names the lock file); past it, or when no lock can be taken (a
read-only cache, a file system without locks), or when the process that held the lock wrote no store (a full disk, a
bad record), a process parses the file on its own, as without the lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import pickle
import shutil
import time
from collections.abc import Iterator
from itertools import chain
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

from kglightning.data.cache import default_cache_root
from kglightning.data.records import KGQARecord, RecordError
from kglightning.data.triple_array import TripleArray, Vocab

__all__ = ["first_reader", "load_store", "remove_store", "save_store", "store_folder"]

log = logging.getLogger(__name__)

FORMAT = 2  # 2: prediction_paths kept
_FIELDS = ("id", "question", "answer", "q_entity", "a_entity", "prediction", "confidence", "extra", "prediction_paths")


def _min_bytes() -> int | None:
    value = os.environ.get("KGLIGHTNING_RECORD_STORE_MIN_MB", "64").strip().lower()
    if value in ("off", "none", "no", "false"):
        return None
    try:
        return int(float(value) * 2**20)
    except ValueError:
        raise ValueError(f"KGLIGHTNING_RECORD_STORE_MIN_MB={value!r}: expected a number of MB or 'off'") from None


def store_folder(path: str | os.PathLike, split: str | None, on_bad_record: str, limit: int | None) -> Path | None:
    """Where the records of ``path`` read with these arguments are stored; ``None`` for a path the store does not
    keep (not a local file, smaller than the threshold, or the store turned off)."""
    if isinstance(path, str) and path.startswith("hf:"):
        return None
    p = Path(path)
    threshold = _min_bytes()
    if threshold is None or not p.is_file():
        return None
    st = p.stat()
    if st.st_size < threshold:
        return None
    from kglightning import __version__  # validation may change between versions

    stamp = f"{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"  # ctime: a same-size edit that kept mtime
    ident = f"{FORMAT}|{__version__}|{p.resolve()}|{stamp}|{split}|{on_bad_record}|{limit}"
    return default_cache_root() / "records" / hashlib.sha1(ident.encode()).hexdigest()[:16]


def save_store(records: list[KGQARecord], folder: Path) -> None:
    """Write ``records`` (a :class:`~kglightning.data.sources.loaders.RecordList`) to ``folder``, whole or not at
    all: into a temporary folder first, then renamed."""
    vocab: Vocab = getattr(records, "vocab", None) or Vocab()
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        parts = [
            r.graph.ids
            if isinstance(r.graph, TripleArray) and r.graph.vocab is vocab
            else vocab.ids(chain.from_iterable(r.graph)).reshape(-1, 3)
            for r in records
        ]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(g) for g in parts], out=offsets[1:])
        graphs = np.lib.format.open_memmap(tmp / "graphs.npy", mode="w+", dtype=np.int32, shape=(int(offsets[-1]), 3))
        for lo, g in zip(offsets.tolist(), parts):  # written part by part: no second copy of the split in memory
            graphs[lo : lo + len(g)] = g
        graphs.flush()
        del graphs
        np.save(tmp / "offsets.npy", offsets)
        (tmp / "strings.json").write_text(json.dumps(vocab.strings, ensure_ascii=False), encoding="utf-8")
        with open(tmp / "records.pkl", "wb") as f:
            pickle.dump([tuple(getattr(r, k) for k in _FIELDS) for r in records], f, protocol=5)
        meta = {
            "format": FORMAT,
            "source": getattr(records, "source", "<memory>"),
            "split": getattr(records, "split", None),
            "skipped": [[e.reason, e.source, e.line, e.field] for e in getattr(records, "skipped", [])],
            "empty_graph": getattr(records, "empty_graph", []),
            "unknown_topic": getattr(records, "unknown_topic", []),
            "records": len(records),
        }
        (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
        os.replace(tmp, folder)
    except OSError:
        if not (folder / "meta.json").is_file():  # not another process's whole store: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_store(folder: Path, out: list) -> None:
    """Fill ``out`` (an empty :class:`~kglightning.data.sources.loaders.RecordList`) with the records
    :func:`save_store` wrote to ``folder``, their graphs views of a memory map."""
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise ValueError(f"{folder}: record store format {meta.get('format')}, expected {FORMAT}")
    out.source, out.split = meta["source"], meta["split"]
    out.vocab = Vocab(json.loads((folder / "strings.json").read_text(encoding="utf-8")))
    graphs = np.load(folder / "graphs.npy", mmap_mode="r")
    offsets = np.load(folder / "offsets.npy")
    with open(folder / "records.pkl", "rb") as f:
        fields = pickle.load(f)
    for i, (rid, question, answer, q_entity, a_entity, prediction, confidence, extra, paths) in enumerate(fields):
        graph = TripleArray.view(graphs[offsets[i] : offsets[i + 1]], out.vocab)
        out.append(KGQARecord(rid, question, answer, q_entity, a_entity, graph, prediction, confidence, extra, paths))
    if len(out) != meta["records"] or len(offsets) != len(out) + 1:
        raise ValueError(f"{folder}: {len(out)} records where {meta['records']} were stored")
    out.skipped = [RecordError(m, source=s, line=ln, field=fd) for m, s, ln, fd in meta["skipped"]]
    out.empty_graph, out.unknown_topic = meta["empty_graph"], meta["unknown_topic"]


def remove_store(folder: Path) -> None:
    """Delete a store that could not be read (it is written again by the next read)."""
    with contextlib.suppress(OSError):
        shutil.rmtree(folder)


def _wait_limit() -> float:
    value = os.environ.get("KGLIGHTNING_RECORD_STORE_WAIT_S", "7200").strip()
    try:
        limit = float(value)
    except ValueError:
        limit = math.nan
    if math.isnan(limit):
        raise ValueError(f"KGLIGHTNING_RECORD_STORE_WAIT_S={value!r}: expected a number of seconds (0: no lock)")
    return limit


@contextlib.contextmanager
def first_reader(folder: Path, source: str | os.PathLike) -> Iterator[str]:
    """Take the lock of ``folder``'s store for a process about to read ``source`` (see the module docstring).

    Yields ``"first"`` when this process holds the lock without having waited (it parses and writes the store, the
    lock held until the block ends), ``"waited"`` when it held it after another process had it (the block looks for
    the store that process wrote; the lock is released before the block runs, so that processes that find none
    parse at the same time, not one after another), or ``"unlocked"`` (no lock: the wait ran out, or none could be
    taken).
    """
    limit = _wait_limit()
    if limit <= 0:  # no lock asked for: every process reads the file itself
        yield "unlocked"
        return
    lock = FileLock(str(folder.with_name(folder.name + ".lock")))
    start, warned = time.monotonic(), 0.0
    state = "first"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        while True:
            waited = time.monotonic() - start
            try:
                lock.acquire(timeout=0 if state == "first" else min(60.0, max(limit - waited, 0.0)))
                break
            except Timeout:
                if state == "first":
                    log.info("another process is reading %s into the record store %s; waiting for it", source, folder)
                state = "waited"
                if waited >= limit:
                    log.warning("waited %.1f s for the record store lock %s (KGLIGHTNING_RECORD_STORE_WAIT_S); "
                                "reading %s without it", waited, lock.lock_file, source)  # fmt: skip
                    state = "unlocked"
                    break
                if waited - warned >= 600:
                    warned = waited
                    log.warning("still waiting (%.0f s) for the record store lock %s; if no process is reading %s "
                                "(a lock left behind on a network file system), restart with "
                                "KGLIGHTNING_RECORD_STORE_WAIT_S=0", waited, lock.lock_file, source)  # fmt: skip
    except Exception as err:  # a read-only cache, a file system without locks (filelock raises more than OSError)
        log.warning("no lock for the record store %s (%s: %s); reading %s without one", folder,
                    type(err).__name__, err, source)  # fmt: skip
        state = "unlocked"
    if state == "waited":
        lock.release()
    try:
        yield state
    finally:
        if state == "first":
            lock.release()
