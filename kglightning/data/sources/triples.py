"""A user's own KG as a triples file (TSV or parquet), indexed once and cached.

Formats:

- ``.tsv`` / ``.txt``: one ``head<TAB>relation<TAB>tail`` triple per line, UTF-8, no quoting; a first line
  ``head<TAB>relation<TAB>tail`` (any capitalisation) is read as a header.
- ``.parquet``: the string columns ``head, relation, tail`` (or ``subject, predicate, object``, or ``h, r, t``).

Every field must be a non-empty string; the first one that is not is reported with its file, line and field. The
:class:`~kglightning.data.kg.KGIndex` built from the file is kept under ``$KGLIGHTNING_CACHE/kg/`` as an Arrow IPC file
(its entity and relation names and its id triples; nothing executable), named by the file's content, so a KG of
millions of triples is parsed once; a later run reads the names and ids and rebuilds the adjacency arrays. The file
carries kglightning's marker beside it (:mod:`~kglightning.data.store.cache_marks`; an index of a release before
markers gets it when it is next read whole), and is read only when it passes
:func:`~kglightning.data.store.cache.untrusted` and a full Arrow validation; one that fails, or is damaged, is moved
aside (with a WARNING) and the KG indexed again, while an error of the system (no memory, no file handles, an I/O
error: :func:`~kglightning.data.store.cache_marks.system_error`) is raised as it is and the index kept. A cache folder that fails the check (another user's, or writable by others) is
neither read nor written: the KG is indexed each time, with a WARNING once.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np

from kglightning.data.kg import KGIndex
from kglightning.data.records import RecordError
from kglightning.data.store.cache import (
    content_digest,
    default_cache_root,
    private_dir,
    untrusted,
    untrusted_above,
    warn_once,
)
from kglightning.data.store.cache_marks import adopt, damage, mark_file, set_aside, touch
from kglightning.data.store.owned_files import create_new
from kglightning.data.store.temporaries import writer_temporary

__all__ = ["load_kg", "read_triples"]

log = logging.getLogger(__name__)

FIELDS = ("head", "relation", "tail")
_PARQUET_COLUMNS = (FIELDS, ("subject", "predicate", "object"), ("h", "r", "t"))


def _check(columns: list[list], source: str, first_line: int) -> None:
    """Raise a :class:`RecordError` for the first null or empty field (``first_line`` = line of row 0)."""
    for field, values in zip(FIELDS, columns, strict=True):
        arr = np.asarray(values, dtype=object)
        bad = np.flatnonzero([not (isinstance(v, str) and v) for v in arr]) if arr.size else []
        if len(bad):
            i = int(bad[0])
            raise RecordError(f"expected a non-empty string, got {arr[i]!r}", source=source, line=first_line + i,
                              field=field)  # fmt: skip


def _read_tsv(path: Path) -> list[tuple[str, str, str]]:
    source, out = str(path), []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8-sig" if lineno == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise RecordError(f"not valid UTF-8 ({e.reason} at byte {e.start})", source=source, line=lineno) from e
            if not text.strip():
                continue
            parts = text.split("\t")
            if len(parts) != 3:
                raise RecordError(f"expected 3 tab-separated fields (head, relation, tail), got {len(parts)}",
                                  source=source, line=lineno)  # fmt: skip
            if lineno == 1 and tuple(p.strip().lower() for p in parts) == FIELDS:
                continue
            for field, value in zip(FIELDS, parts, strict=True):
                if not value.strip():
                    raise RecordError("expected a non-empty string, got ''", source=source, line=lineno, field=field)
            out.append((parts[0], parts[1], parts[2]))
    return out


def _read_parquet(path: Path) -> list[tuple[str, str, str]]:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    names = set(table.column_names)
    cols = next((c for c in _PARQUET_COLUMNS if set(c) <= names), None)
    if cols is None:
        raise RecordError(f"expected columns head, relation, tail (or subject, predicate, object), got "
                          f"{', '.join(table.column_names)}", source=str(path))  # fmt: skip
    columns = [table.column(c).to_pylist() for c in cols]
    _check(columns, str(path), 0)
    return list(zip(*columns, strict=True))


_SUFFIXES = (".tsv", ".txt", ".parquet")


def read_triples(path: str | os.PathLike) -> list[tuple[str, str, str]]:
    """The triples of a ``.tsv``/``.txt`` or ``.parquet`` file (see the module docstring).

    Raises:
        FileNotFoundError: no such file.
        RecordError: a malformed line or an empty field, naming the file, the line (parquet: the 0-based row) and
            the field.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "kg.tsv")
        >>> with open(p, "w") as f:
        ...     _ = f.write("head\\trelation\\ttail\\nFrance\\tcapital\\tParis\\n")
        >>> read_triples(p)
        [('France', 'capital', 'Paris')]
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"KG file {path} does not exist")
    if path.suffix.lower() == ".parquet":
        return _read_parquet(path)
    if path.suffix.lower() in (".tsv", ".txt"):
        return _read_tsv(path)
    raise RecordError("unsupported KG file type (expected .tsv, .txt or .parquet)", source=str(path))


#: the version of the cached index: bump when :func:`read_triples` reads a file differently or the file's layout changes
#: (1: a pickle keyed by path and ``stat``; 2: an Arrow file keyed by content)
INDEX_FORMAT = 2
_SCHEMA_META = {b"kglightning": f"kg-index/{INDEX_FORMAT}".encode()}


def _cache_file(path: Path, cache_dir: Path) -> Path:
    """Where the index of ``path`` is cached: named by the file's content (a copy, or a touch, finds it again)."""
    key = hashlib.sha1(f"{INDEX_FORMAT}|{content_digest(path)}".encode()).hexdigest()[:20]
    return cache_dir / f"index-{key}.arrow"


def _write_index(kg: KGIndex, path: Path) -> None:
    """Write ``kg`` as an Arrow IPC file of one row (its names and id triples, no Python object), through a temporary
    name renamed when whole."""
    import pyarrow as pa

    def one_row(values: pa.Array) -> pa.Array:
        return pa.LargeListArray.from_arrays(pa.array([0, len(values)], pa.int64()), values)

    ids = pa.int32() if max(kg.num_entities, kg.num_relations) < 2**31 else pa.int64()
    h, r, t = kg.edge_ids()
    table = pa.table(
        {
            "entities": one_row(pa.array(kg.entities, pa.large_string())),
            "relations": one_row(pa.array(kg.relations, pa.large_string())),
            **{name: one_row(pa.array(a, ids)) for name, a in (("head", h), ("relation", r), ("tail", t))},
        }
    ).replace_schema_metadata(_SCHEMA_META)
    private_dir(path.parent)
    tmp = writer_temporary(path, "a KG index writer")
    fd = create_new(tmp)  # 0600 whatever the umask (load_kg reads no file others can write); a new file, no link
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        mark_file(path)  # kglightning's (beside it): `kglightning cache clean` may remove it
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _read_index(path: Path) -> KGIndex:
    """The index :func:`_write_index` wrote at ``path``. Raises ``ValueError`` (or what Arrow raises) for a file that
    is not one."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        table = pa.ipc.open_file(source).read_all()
    if table.schema.metadata != _SCHEMA_META or table.num_rows != 1:
        raise ValueError(f"not a kglightning KG index of format {INDEX_FORMAT}")
    table.validate(full=True)  # offsets and lengths checked before any value is read: a damaged file raises
    flat = {name: table.column(name).combine_chunks().values for name in table.column_names}
    return KGIndex.from_ids(
        flat["entities"].to_pylist(),
        flat["relations"].to_pylist(),
        *(flat[name].to_numpy(zero_copy_only=False) for name in ("head", "relation", "tail")),
    )


def load_kg(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None, use_cache: bool = True) -> KGIndex:
    """The :class:`KGIndex` of a triples file, from the cache when a file of the same content was indexed before.

    Args:
        path: a triples file (:func:`read_triples`).
        cache_dir: where indexes are kept (default ``$KGLIGHTNING_CACHE/kg``).
        use_cache: ``False`` reads and indexes the file without touching the cache.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"KG file {path} does not exist")
    if not use_cache or path.suffix.lower() not in _SUFFIXES:  # (an unsupported type: read_triples says so)
        return KGIndex.from_triples(read_triples(path))
    cached = _cache_file(path, Path(cache_dir) if cache_dir is not None else default_cache_root() / "kg")
    try:
        folder_refused = untrusted_above(cached.parent)
    except OSError as err:
        folder_refused = str(err)
    if folder_refused is not None:  # a folder others can write: neither read nor written
        warn_once("untrusted", cached.parent, "the KG index cache %s is not used: %s; indexing %s", cached.parent,
                  folder_refused, path, logger=log)  # fmt: skip
        return KGIndex.from_triples(read_triples(path))
    try:
        refused = untrusted(cached) if os.path.lexists(cached) else None
    except OSError as err:  # a link to nowhere
        refused = str(err)
    if refused:
        set_aside(cached, f"is not trusted ({refused})")
    elif cached.is_file():
        try:
            kg = _read_index(cached)
        except Exception as err:  # a torn, damaged or foreign file: the file is only a cache, set aside and rebuilt
            if not damage(err):  # the system's (no memory, no file handles, an I/O error): the index is kept
                raise
            set_aside(cached, f"cannot be read as the KG index of {path} ({type(err).__name__}: {err})")
        else:
            adopt(cached)  # trusted and whole: an index of a release before markers is marked now
            touch(cached)  # used now: what `kglightning cache clean --older-than` removes last
            log.info("KG %s: %s (cached index %s)", path, kg, cached)
            return kg
    kg = KGIndex.from_triples(read_triples(path))
    log.info("KG %s: %s", path, kg)
    try:
        _write_index(kg, cached)
    except OSError as err:  # a full disk, a read-only cache: index the file again next time
        log.warning("could not cache the KG index of %s in %s (%s)", path, cached, err)
    return kg
