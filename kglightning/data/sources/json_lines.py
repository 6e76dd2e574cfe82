"""One JSON value per line, read so that no line can escape as anything but a :class:`RecordError`.

Python's :func:`json.loads` raises more than :class:`json.JSONDecodeError` on hostile text: a ``ValueError`` for an
integer of more than ``sys.get_int_max_str_digits()`` digits (4300 by default) and a ``RecursionError`` for arrays
or objects nested deeper than the interpreter's stack allows (``[[[[...]]]]``). :func:`decode_json_line` turns each
of these, and bytes that are not UTF-8, into a :class:`~kglightning.data.records.RecordError` naming the file and
the line, so that a reader can stop with that message or skip the line and count it.

Example:
    >>> decode_json_line(b'{"id": "q1"}\\n', source="p.jsonl", line=1)
    {'id': 'q1'}
    >>> try:
    ...     decode_json_line(b"[" * 100_000 + b"]" * 100_000, source="p.jsonl", line=2)
    ... except RecordError as err:
    ...     print(err)
    p.jsonl:2: invalid JSON: nested too deeply to read
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from kglightning.data.records import RecordError

__all__ = ["decode_json_line", "iter_json_lines"]


def decode_json_line(raw: bytes | str, *, source: str, line: int) -> Any:
    """The JSON value of one line (a byte-order mark on line 1 is dropped).

    Args:
        raw: the line, as bytes (decoded as UTF-8) or text.
        source: the file, for the error message.
        line: the 1-based line number, for the error message.

    Raises:
        RecordError: bytes that are not UTF-8, text that is not JSON, a number too long to read, nesting too deep.
    """
    text = _text(raw, source, line)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(f"invalid JSON: {e.msg} (column {e.colno})", source=source, line=line) from None
    except RecursionError:
        raise RecordError("invalid JSON: nested too deeply to read", source=source, line=line) from None
    except ValueError as e:  # an integer past sys.get_int_max_str_digits()
        reason = str(e).split(":")[0]
        raise RecordError(f"invalid JSON: a number that cannot be read ({reason})", source=source, line=line) from None


def _text(raw: bytes | str, source: str, line: int) -> str:
    if isinstance(raw, str):
        return raw.removeprefix("\ufeff") if line == 1 else raw
    try:
        return raw.decode("utf-8-sig" if line == 1 else "utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(f"not valid UTF-8 ({e.reason} at byte {e.start})", source=source, line=line) from None


def iter_json_lines(path: str | os.PathLike, source: str | None = None) -> Iterator[tuple[int, Any]]:
    """``(line, value)`` for every non-blank line of a jsonl file, where ``value`` is the :class:`RecordError` of a
    line that cannot be read (yielded, not raised: the caller decides whether to stop or to skip it)."""
    source = str(path) if source is None else source
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                text = _text(raw, source, lineno)
                if not text.strip():
                    continue
                value = decode_json_line(text, source=source, line=lineno)
            except RecordError as err:
                value = err
            yield lineno, value
