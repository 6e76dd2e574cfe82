"""An OpenAI-compatible ``/chat/completions`` server (vLLM, llama.cpp, TGI, OpenAI...) as an LLM backend.

Only the standard library is used (``urllib`` and a thread pool). Each conversation is one request; up to
``max_concurrency`` are in flight at once. Connection errors, timeouts, HTTP 429 and 5xx are retried with
exponential backoff and seeded jitter (a ``Retry-After`` header is honoured); other 4xx fail at once. With
``cache_dir`` every response is appended to a :class:`~kglightning.llm.backends.cache.ResponseCache` as soon as it
arrives, so a crashed or interrupted run resumes by sending only the requests that have no cached answer.
"""

from __future__ import annotations

import concurrent.futures as cf
import http.client
import ipaddress
import json
import os
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from kglightning.llm.backends.base import ChatMessage, Generation, GenerationParams, LLMBackend, LLMBackendError

__all__ = ["DEFAULT_BASE_URL", "LLMHTTPError", "LLMTimeoutError", "OpenAIChatBackend", "parse_chat_completion"]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"  # vLLM's default


class LLMHTTPError(LLMBackendError):
    """The server answered with an HTTP error status (after retries, for retryable ones)."""

    def __init__(self, message: str, *, url: str, status: int | None, body: str = "") -> None:
        super().__init__(message)
        self.url, self.status, self.body = url, status, body


class LLMTimeoutError(LLMBackendError, TimeoutError):
    """Every attempt of a request ran past ``timeout_s``."""


class _Retryable(Exception):
    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None, timed_out: bool = False
    ) -> None:
        super().__init__(message)
        self.status, self.retry_after, self.timed_out = status, retry_after, timed_out


def parse_chat_completion(payload: dict[str, Any]) -> Generation:
    """A :class:`Generation` from an OpenAI chat-completion response body.

    >>> body = {"choices": [{"message": {"role": "assistant", "content": "Paris"}, "finish_reason": "stop",
    ...          "logprobs": {"content": [{"token": "Paris", "logprob": -0.1}]}}],
    ...         "usage": {"prompt_tokens": 9, "completion_tokens": 1}}
    >>> parse_chat_completion(body)
    Generation(text='Paris', token_logprobs=[-0.1], tokens=['Paris'], prompt_tokens=9, completion_tokens=1, finish_reason='stop', cached=False)
    """
    choice = payload["choices"][0]
    content = (choice.get("logprobs") or {}).get("content")
    usage = payload.get("usage") or {}
    return Generation(
        text=(choice.get("message") or {}).get("content") or "",
        token_logprobs=None if content is None else [float(t["logprob"]) for t in content],
        tokens=None if content is None else [str(t["token"]) for t in content],
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or (len(content) if content else 0)),
        finish_reason=str(choice.get("finish_reason") or "stop"),
    )


def _is_loopback(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OpenAIChatBackend(LLMBackend):
    """Chat completions from an OpenAI-compatible HTTP server.

    One request per conversation, ``max_concurrency`` at a time. When a request fails for good (a 4xx other than
    429, or retries exhausted), no new request is started, the answers already received are kept (in the cache,
    if any) and the error is raised: :class:`LLMHTTPError` (with ``url`` and ``status``) or
    :class:`LLMTimeoutError`. Rerunning with the same ``cache_dir`` then sends only the missing requests.
    ``timeout_s`` bounds each socket operation (connect, each read) of one attempt, not a whole request.

    Args:
        base_url: API root, e.g. ``http://127.0.0.1:8000/v1``; default ``$OPENAI_BASE_URL``, else vLLM's default.
        model: model id; default ``$OPENAI_MODEL``, else the first id listed by ``GET {base_url}/models``.
        api_key: bearer token; default ``$OPENAI_API_KEY`` (none sent if unset).
        timeout_s: socket timeout of one attempt (connect, and each read).
        max_retries: retries after the first attempt on connection errors, timeouts, 429 and 5xx.
        backoff_s: first retry delay; doubles per retry (capped at 60 s), times a seeded jitter in [0.5, 1].
        max_concurrency: requests in flight at once.
        cache_dir: folder of a :class:`~kglightning.llm.backends.cache.ResponseCache` (``None``: no cache).
        show_progress: show a tqdm bar over requests.
        retry_seed: seed of the backoff jitter.
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        max_concurrency: int = 8,
        cache_dir: str | None = None,
        show_progress: bool = True,
        retry_seed: int = 0,
    ) -> None:
        if max_concurrency < 1 or max_retries < 0 or timeout_s <= 0:
            raise ValueError("need max_concurrency >= 1, max_retries >= 0 and timeout_s > 0")
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self._model = model or os.environ.get("OPENAI_MODEL") or None
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self.show_progress = show_progress
        self.retry_seed = retry_seed
        # never send loopback traffic through an http(s)_proxy from the environment
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(self.base_url) else []
        self._opener = urllib.request.build_opener(*handlers)
        self._model_lock = threading.Lock()
        if cache_dir is not None:
            from kglightning.llm.backends.cache import ResponseCache

            self.cache = ResponseCache(cache_dir)

    @property
    def model(self) -> str:
        """The model id sent with each request (asked from ``/models`` once if not given)."""
        with self._model_lock:
            if self._model is None:
                listing = self._request("GET", "/models", None, rng=random.Random(self.retry_seed))
                try:
                    self._model = str(listing["data"][0]["id"])
                except (KeyError, IndexError, TypeError) as e:
                    raise LLMBackendError(f"GET {self.base_url}/models listed no model: {listing!r:.300}") from e
            return self._model

    @property
    def name(self) -> str:
        return self.model

    @property
    def cache_key(self) -> str:
        return f"openai-chat:{self.base_url}:{self.model}"

    def request_body(self, messages: list[ChatMessage], params: GenerationParams) -> dict[str, Any]:
        """The JSON body of one ``POST /chat/completions``."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "seed": params.seed,
            "n": 1,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.logprobs:
            body["logprobs"] = True
        return body

    def _generate_uncached(
        self,
        batch: Sequence[list[ChatMessage]],
        params: GenerationParams,
        on_result: Callable[[int, Generation], None],
    ) -> None:
        from tqdm.auto import tqdm

        bodies = [self.request_body(messages, params) for messages in batch]
        cancelled = threading.Event()

        def task(i: int) -> Generation | None:
            if cancelled.is_set():
                return None
            rng = random.Random(f"{self.retry_seed}:{i}:{json.dumps(bodies[i], sort_keys=True)}")
            payload = self._request("POST", "/chat/completions", bodies[i], rng=rng, cancelled=cancelled)
            return None if payload is None else parse_chat_completion(payload)

        error: BaseException | None = None
        pool = cf.ThreadPoolExecutor(max_workers=self.max_concurrency, thread_name_prefix="openai-chat")
        bar = tqdm(total=len(batch), desc=f"chat ({self.name})", unit="req", disable=not self.show_progress)
        try:
            futures = {pool.submit(task, i): i for i in range(len(batch))}
            for future in cf.as_completed(futures):
                try:
                    gen = future.result()
                except (LLMBackendError, KeyError, IndexError, TypeError, ValueError) as e:
                    if error is None:  # stop starting new requests; keep the answers of those in flight
                        error = e
                        cancelled.set()
                    continue
                if gen is not None:
                    on_result(futures[future], gen)
                    bar.update(1)
        finally:
            cancelled.set()
            pool.shutdown(wait=True, cancel_futures=True)
            bar.close()
        if error is not None:
            if isinstance(error, LLMBackendError):
                raise error
            raise LLMBackendError(f"unexpected response from {self.base_url}/chat/completions: {error!r}") from error

    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        rng: random.Random,
        cancelled: threading.Event | None = None,
    ) -> Any:
        """One request with retries; the decoded JSON body, or ``None`` if ``cancelled`` was set during a backoff."""
        url = self.base_url + path
        last: _Retryable | None = None
        for attempt in range(self.max_retries + 1):
            if attempt:
                delay = min(self.backoff_s * 2 ** (attempt - 1), 60.0) * (0.5 + 0.5 * rng.random())
                if last is not None and last.retry_after is not None:
                    delay = max(delay, last.retry_after)
                if cancelled is not None:
                    if cancelled.wait(delay):
                        return None
                else:
                    time.sleep(delay)
            try:
                return self._send(method, url, body)
            except _Retryable as e:
                last = e
        assert last is not None
        tries = f"{self.max_retries + 1} attempt(s)"
        if last.timed_out:
            raise LLMTimeoutError(f"{method} {url}: {last} ({tries}, timeout_s={self.timeout_s})")
        raise LLMHTTPError(f"{method} {url} failed after {tries}: {last}", url=url, status=last.status)

    def _send(self, method: str, url: str, body: dict[str, Any] | None) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            text = e.read().decode("utf-8", "replace")[:500]
            if e.code == 429 or e.code >= 500:
                raise _Retryable(f"HTTP {e.code}: {text}", status=e.code, retry_after=_retry_after(e.headers)) from e
            raise LLMHTTPError(f"{method} {url}: HTTP {e.code}: {text}", url=url, status=e.code, body=text) from e
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, TimeoutError):
                raise _Retryable("timed out", timed_out=True) from e
            raise _Retryable(f"connection error: {reason}") from e
        except TimeoutError as e:
            raise _Retryable("timed out", timed_out=True) from e
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            raise _Retryable(f"connection error: {e!r}") from e
        try:
            return json.loads(raw)
        except ValueError as e:
            raise LLMBackendError(f"{method} {url}: response is not JSON: {raw[:200]!r}") from e


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None
