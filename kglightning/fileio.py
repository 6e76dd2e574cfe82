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

__all__ = [
    "OutputOverInputError",
    "SplitOutputs",
    "atomic_write",
    "check_outputs_apart",
    "clear_outputs",
    "file_digest",
    "predicted_split",
    "split_folder",
    "write_text_atomic",
]

log = logging.getLogger(__name__)


class OutputOverInputError(ValueError):
    """A command was asked to write an output where one of its inputs lives (:func:`check_outputs_apart`)."""


def check_outputs_apart(
    outputs: Iterable[str | os.PathLike[str]], inputs: Iterable[str | os.PathLike[str] | None]
) -> None:
    """Refuse, before anything is written, outputs that would replace or sit inside an input.

    An output file must not be an input file (compared by resolved path, links and ``..`` followed, and by inode
    where both exist: a hard link is the same file) and must not lie inside an input folder. The files an input
    folder holds through symbolic links (in it, or one folder down, as a hub snapshot's ``data/`` holds them) are
    inputs too: a folder of links to another folder's split files is read from there. ``None`` inputs are skipped
    (an option not given).

    Raises:
        OutputOverInputError: naming the output and the input it would write over.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "test.jsonl").write_text("{}\\n")
        3
        >>> check_outputs_apart([d / "out" / "test.jsonl"], [d / "test.jsonl"])  # apart: nothing said
        >>> check_outputs_apart([d / "test.jsonl"], [d / "test.jsonl"])
        Traceback (most recent call last):
        ...
        kglightning.fileio.OutputOverInputError: would write .../test.jsonl over the input .../test.jsonl: choose an output outside the inputs
    """
    resolved = []
    for given in (Path(i) for i in inputs if i is not None):
        resolved.append((given, Path(os.path.realpath(given))))
        resolved += [(given / link, Path(os.path.realpath(given / link))) for link in _links_inside(given)]
    for out in outputs:
        target = Path(os.path.realpath(out))
        for given, real in resolved:
            same = target == real or (target.exists() and real.exists() and os.path.samefile(target, real))
            if same or (real.is_dir() and target.is_relative_to(real)):
                where = "over the input" if same else "inside the input folder"
                raise OutputOverInputError(f"would write {out} {where} {given}: choose an output outside the inputs")


def _links_inside(folder: Path, limit: int = 10_000) -> list[Path]:
    """The symbolic links in ``folder`` and in its sub-folders (one level down), relative to it; at most ``limit``
    entries are looked at."""
    if not folder.is_dir():
        return []
    links, seen = [], 0
    for level in (folder, *(d for d in _children(folder) if d.is_dir() and not d.is_symlink())):
        for child in _children(level):
            seen += 1
            if seen > limit:
                return links
            if child.is_symlink():
                links.append(child.relative_to(folder))
    return links


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []


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


def predicted_split(trainer: Any) -> str:
    """The split a predict run serves: the ``predict_split`` of ``trainer``'s datamodule, ``"predict"`` when there
    is no trainer, no datamodule or no such attribute (a plain dataloader)."""
    return str(getattr(getattr(trainer, "datamodule", None), "predict_split", None) or "predict")


def split_folder(template: str | os.PathLike[str], split: str) -> Path:
    """The folder for one split's outputs, so that outputs of different splits never share a file name.

    ``{split}`` in ``template`` is replaced by the split; a template without it gets the split as a subfolder.

    Example:
        >>> str(split_folder("outputs/trust", "validation")), str(split_folder("outputs/{split}_run", "test"))
        ('outputs/trust/validation', 'outputs/test_run')
    """
    text = os.fspath(template)
    return Path(text.replace("{split}", split)) if "{split}" in text else Path(text) / split


class SplitOutputs:
    """Mixin for a LightningModule whose ``predict`` writes into ``output_dir``: :meth:`run_dir` is the predicted
    split's folder there, so that predicting the validation split never writes over the test split's outputs."""

    output_dir: str | os.PathLike[str]

    def run_dir(self) -> Path:
        """This run's folder: ``output_dir`` for the predicted split (:func:`split_folder`)."""
        return split_folder(self.output_dir, predicted_split(getattr(self, "_trainer", None)))


def file_digest(path: str | os.PathLike[str]) -> str:
    """``sha256:<hex>`` of a file's bytes (what a served response names its checkpoint and calibration by)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"sha256:{h.hexdigest()}"
