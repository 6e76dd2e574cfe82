"""A user's own KG as a triples file (TSV or parquet), indexed once and cached.

Formats:

- ``.tsv`` / ``.txt``: one ``head<TAB>relation<TAB>tail`` triple per line, UTF-8, no quoting; a first line
  ``head<TAB>relation<TAB>tail`` (any capitalisation) is read as a header.
- ``.parquet``: the string columns ``head, relation, tail`` (or ``subject, predicate, object``, or ``h, r, t``).

Every field must be a non-empty string; the first one that is not is reported with its file, line and field. The
:class:`~kglightning.data.kg.KGIndex` built from the file is pickled under ``$KGLIGHTNING_CACHE/kg/``, keyed by the
file's absolute path, size and modification time, so a KG of millions of triples is parsed and indexed once.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
from pathlib import Path

import numpy as np

from kglightning.data.kg import KGIndex
from kglightning.data.records import RecordError
from kglightning.data.store.cache import default_cache_root, private_dir, unsafe_to_unpickle

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


#: the version of the pickled index (bump when :class:`~kglightning.data.kg.KGIndex` changes what it holds)
INDEX_FORMAT = 1


def _cache_file(path: Path, cache_dir: Path) -> Path:
    st = path.stat()
    ident = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|v{INDEX_FORMAT}|numpy-{np.__version__}"
    key = hashlib.sha1(ident.encode()).hexdigest()[:20]
    return cache_dir / f"{path.stem}-{key}.pkl"


def load_kg(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None, use_cache: bool = True) -> KGIndex:
    """The :class:`KGIndex` of a triples file, from the cache when the file has not changed.

    Args:
        path: a triples file (:func:`read_triples`).
        cache_dir: where indexes are pickled (default ``$KGLIGHTNING_CACHE/kg``).
        use_cache: ``False`` reads and indexes the file without touching the cache.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"KG file {path} does not exist")
    cached = _cache_file(path, Path(cache_dir) if cache_dir is not None else default_cache_root() / "kg")
    unsafe = unsafe_to_unpickle(cached) if use_cache and cached.is_file() else None
    if unsafe:
        log.warning("not loading the KG index cache %s: %s, and unpickling runs code; indexing %s again", cached,
                    unsafe, path)  # fmt: skip
    elif use_cache and cached.is_file():
        try:
            with open(cached, "rb") as f:
                kg = pickle.load(f)
            if not isinstance(kg, KGIndex):
                raise TypeError(f"holds a {type(kg).__name__}, not a KGIndex")
        except Exception as err:  # a torn write, another library version: the file is only a cache, rebuild it
            log.warning("KG index cache %s cannot be read (%s: %s); indexing %s again", cached,
                        type(err).__name__, err, path)  # fmt: skip
        else:
            log.info("KG %s: %s (cached index %s)", path, kg, cached)
            return kg
    kg = KGIndex.from_triples(read_triples(path))
    log.info("KG %s: %s", path, kg)
    if use_cache and not unsafe:
        private_dir(cached.parent)
        tmp = cached.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:  # 0600 under any umask: only this user may replace what is unpickled
            os.chmod(tmp, 0o600)
            pickle.dump(kg, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, cached)
    return kg
