"""Output files that are whole or absent: write to a temporary file beside the target, then rename over it.

A run killed in the middle of :func:`atomic_write` leaves the previous file untouched (or none) and a hidden
``.<name>.*.partial`` file, never a truncated output. :func:`clear_outputs` removes a run's previous outputs when
it starts, so that a run killed before its end does not leave the last run's files looking like its own.

Example:
    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "report.json"
    >>> write_text_atomic(out, "{}\\n")
    >>> try:
    ...     with atomic_write(out) as f:
    ...         _ = f.write('{"half": ')
    ...         raise KeyboardInterrupt  # killed mid-write
    ... except KeyboardInterrupt:
    ...     pass
    >>> out.read_text(), sorted(p.name for p in out.parent.iterdir())
    ('{}\\n', ['report.json'])
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write", "clear_outputs", "write_text_atomic"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "w", encoding: str = "utf-8", fsync: bool = False
) -> Iterator[IO[Any]]:
    """Open a temporary file for writing; on a clean exit it replaces ``path`` (on any exception it is removed).

    The new file keeps the permissions of the file it replaces (a new one gets those of ``open``: ``0666`` less the
    umask), and a symbolic link at ``path`` is followed: its target is replaced, the link stays.

    Args:
        path: the file to write; its folder is created.
        mode: ``"w"`` (text) or ``"wb"`` (bytes).
        encoding: text encoding (text mode).
        fsync: flush the file and its folder to disk around the rename (survives a machine crash, not only a
            process kill).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        try:
            os.fchmod(fd, path.stat().st_mode & 0o7777)
        except FileNotFoundError:
            os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 is not what open() would give
        text = {} if "b" in mode else {"encoding": encoding, "newline": "\n"}
        with os.fdopen(fd, mode, **text) as f:
            yield f
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if fsync:
            folder = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """The process umask, read without changing it where the system tells it (Linux), else set and restored."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike[str], text: str, encoding: str = "utf-8") -> None:
    """``Path(path).write_text(text)``, atomically."""
    with atomic_write(path, "w", encoding) as f:
        f.write(text)


def clear_outputs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Remove the files of ``paths`` that exist (a run's outputs from an earlier run); returns those removed."""
    removed = []
    for p in map(Path, paths):
        if p.is_file() or p.is_symlink():
            p.unlink()
            removed.append(p)
    if removed:
        log.info("removed %d output file(s) of an earlier run: %s", len(removed), ", ".join(map(str, removed[:5])))
    return removed
