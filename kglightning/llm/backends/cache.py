"""A resumable on-disk cache of LLM responses: one append-only JSON-lines file.

Each finished request is appended as one line, written with a single ``write`` and flushed at once, keyed by a
SHA-256 of (backend cache key, messages, decoding settings). If a run crashes, at most the line being written is
lost: on reopening, a line that does not parse (typically a partially written last line) is skipped and counted in
:attr:`ResponseCache.n_corrupt`, and the next append starts on a fresh line. A rerun therefore only sends the
requests that have no complete line yet.

Several processes may share one file (DDP ranks, several backends of one config): each append holds a
``filelock`` lock on ``<file>.lock`` (as Hugging Face datasets does), and under it the file's last byte is read, so
a line torn by a writer that died is ended before ours is added, wherever that writer ran. Appends on a network
file system are not atomic without such a lock.

Example:
    >>> import tempfile
    >>> from kglightning.llm.backends.base import Generation, GenerationParams
    >>> path = Path(tempfile.mkdtemp()) / "responses.jsonl"
    >>> key = ResponseCache.request_key("tiny", [{"role": "user", "content": "hi"}], GenerationParams())
    >>> with ResponseCache(path) as cache:
    ...     cache.put(key, Generation(text="hello", completion_tokens=1))
    >>> with open(path, "a") as f:  # a crash in the middle of the next write
    ...     _ = f.write('{"key": "abc", "genera')
    >>> cache = ResponseCache(path)
    >>> len(cache), cache.n_corrupt, cache.get(key).text, cache.get(key).cached
    (1, 1, 'hello', True)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from filelock import FileLock

from kglightning.llm.backends.base import ChatMessage, Generation, GenerationParams

__all__ = ["ResponseCache"]

log = logging.getLogger(__name__)

CACHE_FILE = "responses.jsonl"


class ResponseCache:
    """Append-only JSON-lines cache of :class:`~kglightning.llm.backends.base.Generation` objects.

    Appends are serialised across threads (a lock) and processes (a file lock next to the file). The whole file is
    read into memory on opening (what other processes append later is not seen); later lines win over earlier ones
    with the same key.

    Args:
        path: the ``.jsonl`` file, or a folder, in which case the file is ``<folder>/responses.jsonl``.
        fsync: also ``os.fsync`` after each line, which survives a machine crash and not only a process crash
            (slower).
        store_requests: store the messages and decoding settings next to each response, for inspection.
    """

    def __init__(self, path: str | os.PathLike[str], fsync: bool = False, store_requests: bool = True) -> None:
        path = Path(path).expanduser()
        if path.suffix != ".jsonl":
            path = path / CACHE_FILE
        self.path = path
        self.fsync = fsync
        self.store_requests = store_requests
        self.n_corrupt = 0
        self._entries: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._file_lock = FileLock(str(path) + ".lock")
        self._load()

    @staticmethod
    def request_key(backend_key: str, messages: Sequence[ChatMessage], params: GenerationParams) -> str:
        """SHA-256 hex digest of the backend key, the messages and the decoding settings.

        >>> a = ResponseCache.request_key("m", [{"role": "user", "content": "x"}], GenerationParams())
        >>> b = ResponseCache.request_key("m", [{"role": "user", "content": "x"}], GenerationParams(seed=1))
        >>> len(a), a == b
        (64, False)
        """
        payload = {"backend": backend_key, "messages": list(messages), "params": params.to_dict()}
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _load(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            data = f.read()
        for lineno, raw in enumerate(data.split(b"\n"), start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
                key, gen = record["key"], record["generation"]
                if not isinstance(key, str) or not isinstance(gen, dict) or not isinstance(gen.get("text"), str):
                    raise ValueError("malformed record")
            except (ValueError, KeyError, TypeError):
                self.n_corrupt += 1
                log.warning("%s: skipping unreadable line %d (%d bytes)", self.path, lineno, len(raw))
                continue
            self._entries[key] = gen
        if self._entries or self.n_corrupt:
            log.info("%s: %d cached responses, %d unreadable lines", self.path, len(self._entries), self.n_corrupt)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get(self, key: str) -> Generation | None:
        """The cached generation for ``key`` (with ``cached=True``), or ``None``."""
        gen = self._entries.get(key)
        return None if gen is None else Generation.from_dict(gen, cached=True)

    def put(
        self,
        key: str,
        generation: Generation,
        *,
        messages: Sequence[ChatMessage] | None = None,
        params: GenerationParams | None = None,
    ) -> None:
        """Append one response to the file (one ``write`` call, flushed) and to the in-memory index."""
        gen = generation.to_dict()
        record: dict[str, Any] = {"key": key, "generation": gen, "time": round(time.time(), 3)}
        if self.store_requests:
            if messages is not None:
                record["messages"] = list(messages)
            if params is not None:
                record["params"] = params.to_dict()
        try:
            line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: escaped, so the line reads back to the same text
            line = (json.dumps(record) + "\n").encode("ascii")
        with self._lock:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            with self._file_lock:
                size = os.fstat(self._fd).st_size
                if size and os.pread(self._fd, 1, size - 1) != b"\n":  # never glue a record onto a torn line
                    line = b"\n" + line
                view = memoryview(line)
                while view:
                    written = os.write(self._fd, view)
                    view = view[written:]
                if self.fsync:
                    os.fsync(self._fd)
            self._entries[key] = gen

    def close(self) -> None:
        """Close the file (reopened on the next :meth:`put`)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.path)!r}, entries={len(self)}, corrupt={self.n_corrupt})"
