"""Embedding shards as Arrow files: one ``text`` column and one ``embedding`` column of float16 vectors.

:class:`~kglightning.data.embeddings.EmbeddingCache` writes each batch of newly encoded strings as one such file
(an Arrow IPC stream, the format of ``datasets``' own cache files, mode ``0600``). It is written normally, to a temporary name that
is then renamed, never through a memory map, so a full disk is an ``OSError`` for the writer and a torn file is never
seen under the final name (the data is synced to disk before the rename, and the header records the number of rows,
so a file cut short is refused). A shard is read only after a full Arrow validation, so a damaged one is refused
(``ValueError``), never a crash. Reading gives the texts and the vectors, the vectors either copied into memory or as a
read-only ``numpy.memmap`` of the file's float16 buffer: the operating system pages in the rows a run looks up and
can drop them again (:func:`~kglightning.data.store.mapped_pages.release_array`).

A shard opens in any Arrow tool::

    import pyarrow as pa, datasets
    table = pa.ipc.open_stream(pa.memory_map("shard-0123abcd.arrow")).read_all()   # or
    ds = datasets.Dataset.from_file("shard-0123abcd.arrow")       # text, embedding (float16 x dim)
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kglightning.data.store.owned_files import create_new
from kglightning.data.store.temporaries import remove_stale_temporaries, temporary_name

__all__ = ["SHARD_FORMAT", "read_shard", "remove_stale_writes", "write_shard"]

log = logging.getLogger(__name__)

#: the ``kglightning`` schema metadata of a shard; a file with another value is not read as one
SHARD_FORMAT = "embedding-shard/1"

_memmap = np.memmap  # (a test makes mapping fail through it)


def write_shard(path: str | Path, texts: list[str], rows: np.ndarray) -> None:
    """Write ``texts`` and their ``rows`` (``(len(texts), dim)``, stored as float16) to the shard file ``path``,
    through a temporary file in the same folder that is renamed when whole; removed again when the write fails."""
    path = Path(path)
    rows = np.ascontiguousarray(rows, dtype=np.float16)
    if rows.ndim != 2 or rows.shape[0] != len(texts) or rows.shape[1] == 0:
        raise ValueError(f"{path}: {len(texts)} texts and rows of shape {tuple(rows.shape)} do not make a shard")
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1), type=pa.float16()), rows.shape[1])
    table = pa.table({"text": pa.array(texts, type=pa.large_string()), "embedding": vectors})
    table = table.replace_schema_metadata({"kglightning": SHARD_FORMAT, "rows": str(len(texts))})
    tmp = path.with_name(temporary_name(path.name))  # see remove_stale_writes
    fd = create_new(tmp)  # 0600, a new file: nothing is written through a name someone else prepared
    try:
        with os.fdopen(fd, "wb", buffering=1 << 20) as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            sink.flush()
            os.fsync(sink.fileno())  # on disk before the name says the shard is whole
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stale_writes(folder: str | Path) -> int:
    """Remove the temporary files that killed writers of shards left in ``folder`` (``.<shard>.kgl-<host>.<pid>.tmp``:
    this host's whose process is gone and nothing written for ten minutes, any host's untouched for a day in the
    cache: :func:`~kglightning.data.store.temporaries.stale_temporary`); return how many."""
    return remove_stale_temporaries(Path(folder), None, "an embedding cache writer")


def read_shard(path: str | Path, mapped: bool = False) -> tuple[list[str], np.ndarray, bool]:
    """A shard's texts, its float16 rows ``(n, dim)``, and whether the rows are a read-only memory map of the file
    (asked with ``mapped``; where the file cannot be mapped, or on a big-endian machine, they are read instead).

    Raises:
        ValueError: a file that is not a whole shard (torn: fewer rows than its header says, or none; foreign; of
            another format).
        OSError: the file cannot be opened or read (missing, no permission).
    """
    path = Path(path)
    try:
        source = pa.memory_map(str(path), "r")
    except OSError as err:  # no address space left, a file system without mmap: read it (if it can be read at all)
        data = path.read_bytes()
        log.warning("embedding shard %s cannot be memory-mapped (%s); reading it", path, err)
        texts, values, dim = _columns(_parse(pa.py_buffer(data), path), path)
        return texts, values.to_numpy(zero_copy_only=False).reshape(len(texts), dim).copy(), False
    with source:
        base = source.read_buffer(1).address if source.size() else 0
        source.seek(0)
        texts, values, dim = _columns(_parse(source, path), path)
        if mapped and sys.byteorder == "little":
            start = values.buffers()[1].address - base + values.offset * 2
            rows = _map(path, start, (len(texts), dim), source.size())
            first = values.slice(0, dim).to_numpy(zero_copy_only=False)
            if rows is not None and np.array_equal(rows[0], first, equal_nan=True):
                return texts, rows, True
        return texts, values.to_numpy(zero_copy_only=False).reshape(len(texts), dim).copy(), False


def _parse(source: Any, path: Path) -> pa.Table:
    """The table of a shard's bytes (mapped or read), fully validated (offsets, lengths and UTF-8 checked before a
    value is read: a damaged offset would otherwise crash the process): any failure to parse or validate them is the
    file's, a torn, damaged or foreign shard (pyarrow raises ``OSError`` for a message cut short, ``ArrowInvalid``
    for other damage)."""
    try:
        table = pa.ipc.open_stream(source).read_all()
        table.validate(full=True)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{path}: not a whole embedding shard ({err})") from err
    return table


def _columns(table: pa.Table, path: Path) -> tuple[list[str], pa.Array, int]:
    meta = table.schema.metadata or {}
    fmt = meta.get(b"kglightning", b"").decode(errors="replace")
    if fmt != SHARD_FORMAT:
        raise ValueError(f"{path}: not an embedding shard of format {SHARD_FORMAT!r} (its format: {fmt!r})")
    names = table.schema.names
    if "text" not in names or "embedding" not in names:
        raise ValueError(f"{path}: an embedding shard needs the columns 'text' and 'embedding', found {names}")
    kind = table.schema.field("embedding").type
    if not pa.types.is_fixed_size_list(kind) or kind.value_type != pa.float16() or kind.list_size < 1:
        raise ValueError(f"{path}: column 'embedding' is {kind}, not fixed-size lists of float16")
    text = table.column("text")
    if not (pa.types.is_string(text.type) or pa.types.is_large_string(text.type)) or text.null_count:
        raise ValueError(f"{path}: column 'text' must be strings without nulls ({text.type}, {text.null_count} null)")
    said = meta.get(b"rows", b"").decode(errors="replace")  # absent in the first shards of this format
    if not table.num_rows or (said and (not said.isdigit() or int(said) != table.num_rows)):
        raise ValueError(f"{path}: a torn embedding shard ({table.num_rows} rows; its header says {said or '?'})")
    column = table.column("embedding")  # one batch as written; combining would copy it out of the map
    emb = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    if emb.null_count or emb.flatten().null_count:
        raise ValueError(f"{path}: column 'embedding' holds nulls")
    return text.to_pylist(), emb.flatten(), kind.list_size


def _map(path: Path, start: int, shape: tuple[int, int], size: int) -> np.memmap | None:
    """A read-only map of ``shape`` float16 rows at byte ``start`` of ``path``; ``None`` (read instead) when the rows
    are not where the reader found them in the file, or the file cannot be mapped."""
    if start < 0 or start % 2 or start + shape[0] * shape[1] * 2 > size:
        return None
    try:
        return _memmap(path, dtype="<f2", mode="r", offset=start, shape=shape)
    except (OSError, ValueError) as err:  # no address space, a file system without mmap
        log.warning("embedding shard %s cannot be memory-mapped (%s); reading it", path, err)
        return None
