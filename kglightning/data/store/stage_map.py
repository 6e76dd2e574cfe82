"""Per-question preparation as cached ``datasets`` map steps: on several processes, resumable, one part of N.

A preparation stage (the PCST cuts of ``build-subgraphs``, ...) is a function from a batch of question rows to a
batch of output rows. :func:`cached_map` runs it with :meth:`datasets.Dataset.map` over contiguous pieces of the
questions, each piece on ``workers`` processes (``num_proc``), and keeps each piece's output as Arrow files in a
folder named by the stage's fingerprint (:func:`fingerprint`: the questions' content, the stage's parameters and
whatever else its output depends on). A run that stopped part-way (killed, out of memory, a machine lost) is run
again with the same arguments and maps only the pieces it had not finished, with any number of processes
(``datasets`` keeps the layout of a piece's files that it finds and maps only its missing parts; a stored piece that
cannot be read (damage: a file cut short, schema metadata that is not JSON; an error of the system is raised as it
is), is not trusted (:func:`~kglightning.data.store.cache.untrusted`), fails a full Arrow validation, or holds fewer
rows than it should, is set aside in its folder (``<file>.unreadable-<time>``, with a WARNING) and mapped again); a change of any parameter gives another fingerprint, so nothing
stale is read. A folder under a kind folder of a cache (``pcst-cuts/<fingerprint>``) is a cache entry created with
kglightning's marker (:mod:`~kglightning.data.store.cache_marks`); its files are made ``0600``. The output does not
depend on ``workers``: pieces, and the shards ``datasets`` cuts them into, are contiguous and concatenated in order.

:func:`take_shard` gives one contiguous part of N of the questions (``--shard i/N``):
:meth:`datasets.Dataset.shard` with ``contiguous=True``, whose first ``len % N`` parts hold one row more.

The function reads what it shares with the other processes (a KG index, an embedding table) from
:func:`stage_state`, which holds ``state`` while the map runs: the processes are forked, so they inherit it without
a copy or a pickle. Where the platform cannot fork, the map runs in one process, with a warning.

Example:
    >>> import datasets
    >>> def square(batch):
    ...     k = stage_state()
    ...     return {"y": [k * x * x for x in batch["x"]]}
    >>> ds = datasets.Dataset.from_dict({"x": list(range(5))})
    >>> features = datasets.Features({"y": datasets.Value("int64")})
    >>> out = cached_map(ds, square, features, None, state=2, piece=2, progress=False)
    >>> list(out["y"]), list(take_shard(ds, 1, 2)["x"])
    ([0, 2, 8, 18, 32], [3, 4])
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import pickle
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from kglightning.data.store.cache import private_dir, untrusted, untrusted_above
from kglightning.data.store.cache_marks import damage, entry_folder, entry_holding, set_aside, touch
from kglightning.data.store.cache_pins import pin, unpin

__all__ = [
    "cached_map",
    "can_fork",
    "fingerprint",
    "map_running",
    "parse_shard",
    "shard_bounds",
    "shard_suffix",
    "stage_state",
    "stored_map",
    "take_shard",
    "torch_threads",
]

log = logging.getLogger(__name__)

_STATE: Any = None
_RUNNING = False
_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
#: a temporary file of ``datasets``' writer untouched this long is taken for a killed writer's and removed
STALE_TMP_SECONDS = 6 * 3600


def stage_state() -> Any:
    """What the running :func:`cached_map` was given as ``state`` (read by its function, in any process)."""
    if not _RUNNING:
        raise RuntimeError("stage_state() is only set while cached_map runs its function")
    return _STATE


def map_running() -> bool:
    """Whether a :func:`cached_map` runs its function here (in this process, or in the parent it forked from): a
    step that would start a map of its own runs in this process instead."""
    return _RUNNING


def fingerprint(*parts: Any) -> str:
    """A hex digest of ``parts`` (JSON-serialisable values; anything else by its ``str``)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def parse_shard(spec: str) -> tuple[int, int]:
    """``"i/N"`` as ``(i, N)``: part ``i`` (from 0) of ``N``.

    Raises:
        ValueError: not of that form, or ``i`` outside ``[0, N)``.
    """
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(f"shard {spec!r}: expected i/N, e.g. 0/4 for the first of four")
    index, count = int(m.group(1)), int(m.group(2))
    if not 1 <= count <= 99999 or not 0 <= index < count:
        raise ValueError(f"shard {spec!r}: need 0 <= i < N, 1 <= N <= 99999 (e.g. 0/4 ... 3/4)")
    return index, count


def shard_suffix(index: int, count: int) -> str:
    """The file-name part naming a shard (sorts in shard order)."""
    return f"shard-{index:05d}-of-{count:05d}"


def shard_bounds(n: int, index: int, count: int) -> tuple[int, int]:
    """``[lo, hi)`` of part ``index`` of ``count`` contiguous parts of ``n`` rows, the rows that
    :meth:`datasets.Dataset.shard` (``contiguous=True``) gives that part: ``n // count`` each, and one more for each
    of the first ``n % count`` parts.

    Example:
        >>> [shard_bounds(10, i, 3) for i in range(3)]
        [(0, 4), (4, 7), (7, 10)]
    """
    size, extra = divmod(n, count)
    lo = size * index + min(index, extra)
    return lo, lo + size + (index < extra)


def take_shard(ds: Any, index: int, count: int) -> Any:
    """Part ``index`` of ``count`` contiguous parts of the dataset ``ds``:
    ``ds.shard(count, index, contiguous=True)``, the rows :func:`shard_bounds` names; the parts, concatenated in order, are ``ds``. An empty
    part (more parts than rows) is ``ds.select([])``: ``datasets`` refuses one that starts at the end."""
    lo, hi = shard_bounds(len(ds), index, count)
    if lo == hi:
        return ds.select([])
    part = ds.shard(num_shards=count, index=index, contiguous=True)
    first = [pickle.dumps(d.with_format(None)[i]) for d, i in ((part, 0), (ds, lo))]  # NaN-safe, any format
    if len(part) != hi - lo or first[0] != first[1]:  # the ranges build-subgraphs records must be the rows cut
        raise RuntimeError(f"datasets cut {len(part)} rows for part {index} of {count} of {len(ds)}; expected "
                           f"rows [{lo}, {hi})")  # fmt: skip
    return part


def can_fork() -> bool:
    """Whether ``datasets``' process pool (``multiprocess``'s default context) forks, so that its processes
    inherit :func:`stage_state`."""
    import multiprocess
    import multiprocess.context

    method = multiprocess.get_start_method(allow_none=True)  # None: not set yet (and not set by asking this way)
    if method is None:
        method = multiprocess.context._default_context._default_context.get_start_method()
    return method == "fork"


@contextlib.contextmanager
def _quiet_bars() -> Iterator[None]:
    """``datasets``' own bar per piece hidden; the caller shows one bar for the whole map."""
    import datasets

    was = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was:
            datasets.enable_progress_bars()


def _remove_stale_temporaries(folder: Path) -> None:
    """``datasets`` writes a piece to ``tmp*`` in the folder and renames it when whole: one a killed writer left
    behind (untouched for :data:`STALE_TMP_SECONDS`) is removed."""
    now = time.time()
    for p in folder.glob("tmp*"):
        with contextlib.suppress(OSError):
            if now - p.stat().st_mtime > STALE_TMP_SECONDS:
                p.unlink()
                log.info("removed %s, left by a writer that did not finish", p)


def _map_again(part: Any, function: Callable, kwargs: dict[str, Any], name: Path, why: str) -> Any:
    """Set a stored piece's files (``name`` and its per-process parts) aside (``<file>.unreadable-<time>`` in the
    folder, with a WARNING; they go when the folder's entry is cleaned) and map the piece again, writing its files
    anew. (Two processes that find the same damaged piece at once may set each other's new files aside: run one
    process per folder.)"""
    for p in name.parent.glob(f"{name.stem}*{name.suffix}"):
        if set_aside(p, why) is None:
            p.unlink(missing_ok=True)
    done = part.map(function, **{**kwargs, "load_from_cache_file": False})
    if len(done) != len(part):
        raise RuntimeError(f"{name}: the map gave {len(done)} rows for {len(part)}")
    return done


def cached_map(
    ds: Any,
    function: Callable[[dict[str, list]], dict[str, list]],
    features: Any,
    folder: str | Path | None,
    *,
    state: Any = None,
    workers: int = 1,
    piece: int = 512,
    batch_size: int = 16,
    desc: str = "map",
    progress: bool = True,
    unit: str = "q",
) -> Any:
    """``function`` over the rows of ``ds`` (``batched``: a dict of columns in, a dict of columns out, one output
    row per input row), with the output kept in ``folder`` and reused.

    Args:
        ds: the input rows.
        function: the stage; it reads ``state`` through :func:`stage_state`.
        features: the output columns' ``datasets.Features`` (fixed, so that a piece whose values are all missing has
            the same schema as the others).
        folder: where the pieces' Arrow files are kept, one folder per fingerprint; ``None`` keeps nothing.
        state: what the function shares with the other processes.
        workers: processes per piece (``num_proc``).
        piece: rows per piece: the unit of work that a rerun does not repeat.
        batch_size: rows per call of ``function`` (and per write).
        desc: the progress bar's label.
        progress: show a progress bar.
        unit: what a row is, in the progress bar (``q``: a question).

    Raises:
        ValueError: ``workers``, ``piece`` or ``batch_size`` below 1.
        RuntimeError: called while another cached_map runs in this process (its state would be replaced).
    """
    global _STATE, _RUNNING
    import datasets
    from tqdm.auto import tqdm

    if workers < 1 or piece < 1 or batch_size < 1:
        raise ValueError(f"workers, piece and batch_size must be >= 1, got {workers}, {piece}, {batch_size}")
    if workers > 1 and not can_fork():
        log.warning("this platform cannot fork; the map runs in one process")
        workers = 1
    if _RUNNING:
        raise RuntimeError("cached_map cannot run while another cached_map runs here")
    folder = None if folder is None else _open_folder(Path(os.path.abspath(folder)))  # datasets' paths are absolute
    pinned = None if folder is None else pin(folder)  # being written: kglightning cache clean leaves it
    if folder is not None:
        _remove_stale_temporaries(folder)
    parts = []
    _STATE, _RUNNING = state, True
    try:
        with _quiet_bars(), tqdm(total=len(ds), desc=desc, unit=unit, disable=not progress, leave=False) as bar:
            for lo in range(0, len(ds), piece):
                hi = min(lo + piece, len(ds))
                part = ds.select(range(lo, hi))
                name = None if folder is None else folder / f"piece-{lo:09d}-{hi:09d}.arrow"
                procs = min(workers, -(-(hi - lo) // batch_size))
                kwargs = dict(
                    batched=True, batch_size=batch_size, writer_batch_size=batch_size, remove_columns=part.column_names,
                    features=features, cache_file_name=None if name is None else str(name), keep_in_memory=name is None,
                    load_from_cache_file=name is not None, new_fingerprint=fingerprint(str(name), lo, hi),
                    num_proc=procs if procs > 1 else None,
                )  # fmt: skip
                stored = name is not None and any(name.parent.glob(f"{name.stem}*{name.suffix}"))
                why, done = _refused_piece(name) if stored else None, None
                try:
                    done = part.map(function, **kwargs) if why is None else None
                except (pa.ArrowInvalid, OSError) as err:  # a stored piece that cannot be read: mapped again
                    if not stored or not damage(err):  # the function's own error, or the system's: raised
                        raise
                    why = f"cannot be read ({type(err).__name__}: {err})"
                if done is not None and stored and why is None:
                    why = _damaged(done)
                if why is not None:
                    done = _map_again(part, function, kwargs, name, why)
                if name is not None:  # whatever the umask: a piece others can write is not read again
                    for f in name.parent.glob(f"{name.stem}*{name.suffix}"):
                        with contextlib.suppress(OSError):
                            os.chmod(f, 0o600)
                if len(done) != hi - lo and stored:  # a stored piece cut short (a crash, a partial copy)
                    done = _map_again(part, function, kwargs, name, f"holds {len(done)} rows, not {hi - lo}")
                if len(done) != hi - lo:
                    raise RuntimeError(f"{desc}: the map gave {len(done)} rows for {hi - lo} (rows {lo} to {hi - 1})")
                parts.append(done)
                bar.update(hi - lo)
    finally:
        _STATE, _RUNNING = None, False
        unpin(pinned)
    if not parts:
        return datasets.Dataset.from_dict({k: [] for k in features}, features=features)
    out = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if folder is not None:
        _write_manifest(folder, parts, len(out))
    return out


def _open_folder(folder: Path) -> Path | None:
    """``folder`` made ready for a map's pieces: the cache entry holding it (under a kind folder, e.g.
    ``pcst-cuts/<fingerprint>``) created with kglightning's marker, the folder ``0700``; ``None`` (nothing kept, with
    a WARNING) when it cannot be trusted (:func:`~kglightning.data.store.cache.untrusted`)."""
    entry = entry_holding(folder)
    why = untrusted_above(folder)  # nothing is made in a folder another user owns or can write
    if why is None:
        if entry is not None:
            entry_folder(entry)
        private_dir(folder)
        why = untrusted(folder)
    if why is not None:
        log.warning("map folder %s is not used (%s); nothing is kept", folder, why)
        return None
    touch(entry)  # used now: what `kglightning cache clean --older-than` removes last
    return folder


def _refused_piece(name: Path) -> str | None:
    """Why the stored files of the piece ``name`` must not be read, or ``None``: another user's or writable by others,
    or damaged (they cannot be opened as ``datasets`` files: a stream cut short, schema metadata that is not UTF-8,
    not JSON or not of its shape). An error of the system (no memory, no file handles, an I/O error:
    :func:`~kglightning.data.store.cache_marks.system_error`) is raised as it is."""
    import datasets

    files = sorted(name.parent.glob(f"{name.stem}*{name.suffix}"))
    why = next((f"is not trusted ({w})" for w in (untrusted(p, alone=True) for p in files) if w is not None), None)
    for p in files if why is None else ():
        try:
            datasets.Dataset.from_file(str(p))
        except Exception as err:
            if not damage(err):
                raise
            return f"cannot be read ({type(err).__name__}: {err})"
    return why


def _damaged(done: Any) -> str | None:
    """What a full Arrow validation of a stored piece's table finds wrong (a damaged offset would otherwise crash the
    process when a value is read), or ``None``."""
    try:
        done.data.table.validate(full=True)
    except pa.ArrowException as err:
        return f"is damaged ({err})"
    return None


#: written when every piece of a map is stored: what :func:`stored_map` reads
MANIFEST = "complete.json"


def _write_manifest(folder: Path, parts: list[Any], rows: int) -> None:
    files = [Path(f["filename"]).name for part in parts for f in part.cache_files]
    if any(Path(f["filename"]).parent != folder for part in parts for f in part.cache_files):
        return  # a part not stored here (cannot happen with a folder; nothing promised then)
    with contextlib.suppress(OSError):  # a read-only folder: the next run maps (reads) the pieces again
        fd, tmp = tempfile.mkstemp(prefix="tmp", suffix=".json", dir=folder)  # a tmp* file: stale ones are removed
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"rows": rows, "files": files}))
        os.replace(tmp, folder / MANIFEST)


def stored_map(folder: str | Path | None) -> Any:
    """The output of a :func:`cached_map` that finished in ``folder``, read from its files without its input, or
    ``None`` when there is none (not finished, or a file gone, unreadable, damaged or not trusted: run
    :func:`cached_map`, which maps only what is missing and maps a damaged piece again). The files are read only
    when they pass :func:`~kglightning.data.store.cache.untrusted` and a full Arrow validation."""
    import datasets

    if folder is None:
        return None
    folder = Path(os.path.abspath(folder))
    try:
        if untrusted(folder / MANIFEST) is not None:
            return None  # cached_map says why
        manifest = json.loads((folder / MANIFEST).read_text())
        if not all(isinstance(name, str) and Path(name).name == name for name in manifest["files"]):
            return None  # only files of the folder itself are read
        if any(untrusted(folder / name, alone=True) is not None for name in manifest["files"]):
            return None
        parts = [datasets.Dataset.from_file(str(folder / name)) for name in manifest["files"]]
        for part in parts:
            part.data.table.validate(full=True)
        out = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    except (OSError, ValueError, KeyError, TypeError, IndexError, pa.ArrowException):
        return None
    if len(out) != manifest["rows"]:
        return None
    touch(entry_holding(folder))  # used now: what `kglightning cache clean --older-than` removes last
    return out


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads (the same arithmetic in every process of a map; a forked process that
    used its parent's OpenMP pool would hang), then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
