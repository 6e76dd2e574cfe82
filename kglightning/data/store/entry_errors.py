"""Telling a cache entry's damage from the system's errors, when an entry cannot be read.

A reader of the cache sets a damaged entry aside and builds it again (:func:`damage`), but raises an error of the
system as it is, setting nothing aside (:func:`system_error`): an entry that cannot be read for want of memory or
file handles, or through an I/O error, is whole, and is read again later.
"""

from __future__ import annotations

__all__ = ["damage", "system_error"]


def system_error(err: BaseException) -> bool:
    """Whether ``err``, raised while a cache entry was read, is the system's (memory, file handles, an I/O error, a
    full disk: an ``OSError`` with an ``errno``; the entry is kept and read again later) rather than the entry's
    damage (set aside and written again): pyarrow tells a stream cut short as an ``OSError`` without ``errno``, and a
    file missing from an entry (a torn record store) is damage too."""
    if isinstance(err, MemoryError):
        return True
    return isinstance(err, OSError) and err.errno is not None and not isinstance(err, FileNotFoundError)


def damage(err: BaseException) -> bool:
    """Whether ``err``, raised while a cache entry was read, is the entry's damage (it is set aside and built again)
    rather than the system's (:func:`system_error`: raised as it is, nothing set aside): a ``ValueError`` (pyarrow's
    ``ArrowInvalid``, a ``JSONDecodeError``, a ``UnicodeDecodeError``, a
    :class:`~kglightning.data.records.RecordError`), an ``OSError`` without an ``errno`` (a stream cut short) or a
    missing file, or another error of pyarrow's reading the file (an unknown type in a damaged schema).

    Example:
        >>> damage(UnicodeDecodeError("utf-8", b"\\xff", 0, 1, "invalid start byte")), damage(OSError(24, "Too many"))
        (True, False)
    """
    if system_error(err) or not isinstance(err, Exception):
        return False
    if isinstance(err, (ValueError, OSError)):
        return True
    import pyarrow as pa

    return isinstance(err, pa.ArrowException)
