"""An OpenAI-compatible ``/chat/completions`` server (vLLM, llama.cpp, TGI, OpenAI...) as an LLM backend.

HTTP goes through the standard library only (``urllib`` and a thread pool). Each conversation is one request; up
to ``max_concurrency`` are in flight at once (by default as many as the server advertises in ``GET /models``, else
:data:`DEFAULT_MAX_CONCURRENCY`). The API key is read from an environment variable or a file, never taken as a
value, so that it cannot end up in a saved config, a printed config, an error message or a log. Connection errors,
timeouts, HTTP 429 and 5xx are retried with exponential backoff and seeded jitter (a ``Retry-After`` header is
honoured); other 4xx fail at once. With ``cache_dir`` every response is appended to a
:class:`~kglightning.llm.backends.cache.ResponseCache` as soon as it arrives, so a crashed or interrupted run
resumes by sending only the requests that have no cached answer.
"""

from __future__ import annotations

import concurrent.futures as cf
import http.client
import ipaddress
import json
import os
import random
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from jsonargparse.typing import SecretStr

from kglightning.llm.backends.base import ChatMessage, Generation, GenerationParams, LLMBackend, LLMBackendError

if TYPE_CHECKING:
    from kglightning.llm.trie.names import NameChoice

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_MAX_CONCURRENCY",
    "LLMHTTPError",
    "LLMTimeoutError",
    "OpenAIChatBackend",
    "parse_chat_completion",
]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"  # vLLM's default
DEFAULT_MAX_CONCURRENCY = 8
"""Requests in flight at once when neither ``max_concurrency`` nor the server's ``/models`` listing says."""

_HOW_TO_PASS_A_KEY = (
    "put the API key in an environment variable (OPENAI_API_KEY by default; another name with api_key_env, e.g. "
    "--model.init_args.reasoner.init_args.api_key_env MY_KEY_VAR) or in a file (api_key_file, e.g. "
    "--model.init_args.reasoner.init_args.api_key_file ~/.config/openai.key)"
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# common API tokens whose alphabet is also that of a variable name: a known prefix, then 16+ letters and digits
# (no further underscore, as a variable name would have), with a digit among them when fewer than 20
_TOKEN_LIKE = re.compile(
    r"(?:hf|gsk|ghp|gho|ghu|ghs|glpat|xai|AKIA|ASIA)_?(?:[A-Za-z0-9]{20,}|(?=[A-Za-z]*\d)[A-Za-z0-9]{16,})"
)


def _shown_env_name(name: str) -> str:
    """``name`` for an error message, unless it looks like a token (then it is not echoed).

    >>> _shown_env_name("MY_KEY"), _shown_env_name("hf_abcdefgh1jklmnopqrstuv")
    ('MY_KEY', 'named by api_key_env (its name looks like a key itself, so it is not shown: pass the name of a variable)')
    """
    looks_like_token = bool(_TOKEN_LIKE.fullmatch(name)) or (  # or 20+ characters with no word break, and a digit
        len(name) >= 20 and "_" not in name and any(c.isdigit() for c in name) and any(c.isalpha() for c in name)
    )
    if looks_like_token:
        return (
            "named by api_key_env (its name looks like a key itself, so it is not shown: pass the name of a variable)"
        )
    return name


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

    One request per conversation, :attr:`concurrency` at a time. When a request fails for good (a 4xx other than
    429, or retries exhausted), no new request is started, the answers already received are kept (in the cache,
    if any) and the error is raised: :class:`LLMHTTPError` (with ``url`` and ``status``) or
    :class:`LLMTimeoutError`. Rerunning with the same ``cache_dir`` then sends only the missing requests.
    ``timeout_s`` bounds each socket operation (connect, each read) of one attempt, not a whole request.

    The API key is never held as a value: it is read from ``api_key_file`` if given, else from the environment
    variable named ``api_key_env``, when a request is built, and it goes only into the ``Authorization`` header
    (not into ``repr``, errors, logs, cache keys or the config that LightningCLI saves). ``repr`` does no network
    I/O: it shows the model only once it is known.

    Args:
        base_url: API root, e.g. ``http://127.0.0.1:8000/v1``; default ``$OPENAI_BASE_URL``, else vLLM's default.
        model: model id; default ``$OPENAI_MODEL``, else the first id listed by ``GET {base_url}/models`` (asked
            when the first request needs it).
        api_key_env: name of the environment variable that holds the bearer token. With the default
            ``OPENAI_API_KEY`` unset, no token is sent (a local vLLM needs none); another name must be set.
        api_key_file: path of a file that holds the bearer token (surrounding whitespace ignored); it wins over
            ``api_key_env``.
        timeout_s: socket timeout of one attempt (connect, and each read).
        max_retries: retries after the first attempt on connection errors, timeouts, 429 and 5xx.
        backoff_s: first retry delay; doubles per retry (capped at 60 s), times a seeded jitter in [0.5, 1].
        max_concurrency: requests in flight at once. ``None``: what the server advertises as ``max_concurrency``
            in its ``/models`` entry for the model (:class:`~kglightning.llm.backends.server.ChatCompletionServer`
            does), else :data:`DEFAULT_MAX_CONCURRENCY`. More requests than the server serves at once only queue
            there, and queued ones can run past ``timeout_s`` and be re-sent.
        cache_dir: folder of a :class:`~kglightning.llm.backends.cache.ResponseCache` (``None``: no cache).
        show_progress: show a tqdm bar over requests.
        retry_seed: seed of the backoff jitter.
        structured_outputs: how to ask the server for structured generation over a set of names
            (:meth:`~kglightning.llm.backends.base.LLMBackend.generate_with_params` with ``choices``): ``"vllm"``
            sends ``{"structured_outputs": {"regex": ...}}`` (vLLM >= 0.12), ``"vllm-legacy"`` sends ``guided_regex``
            (older vLLM); ``None``: the server cannot, and such requests raise :class:`NotImplementedError`.
        api_key: refused. It exists only so that a key given as a value (Python, YAML or command line) is read as
            a secret, which configs and error messages mask, and refused with a message saying how to pass it.
    """

    def __init__(
        self,
        base_url: str | None = None,
        model: str | None = None,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        api_key_file: str | None = None,
        timeout_s: float = 60,
        max_retries: int = 5,
        backoff_s: float = 1.0,
        max_concurrency: int | None = None,
        cache_dir: str | None = None,
        show_progress: bool = True,
        retry_seed: int = 0,
        structured_outputs: Literal["vllm", "vllm-legacy"] | None = None,
        api_key: SecretStr | None = None,
    ) -> None:
        if api_key is not None:
            raise ValueError(
                f"{type(self).__name__} does not take the API key as a value (it would be saved in config.yaml, "
                f"printed by --print_config and shown in error messages): {_HOW_TO_PASS_A_KEY}"
            )
        if (max_concurrency is not None and max_concurrency < 1) or max_retries < 0 or timeout_s <= 0:
            raise ValueError("need max_concurrency >= 1 (or None), max_retries >= 0 and timeout_s > 0")
        if not _ENV_NAME.fullmatch(api_key_env):
            raise ValueError(
                "api_key_env must be the name of an environment variable (letters, digits and _), such as "
                f"OPENAI_API_KEY, not the key itself (the value is not shown here): {_HOW_TO_PASS_A_KEY}"
            )
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self._model = model or os.environ.get("OPENAI_MODEL") or None
        self.api_key_env = api_key_env
        self.api_key_file = None if api_key_file is None else str(Path(api_key_file).expanduser())
        self._api_key()  # fail now, not at the first request, when the file or the named variable is missing
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_concurrency = max_concurrency
        self._concurrency = max_concurrency
        self.show_progress = show_progress
        self.retry_seed = retry_seed
        if structured_outputs not in (None, "vllm", "vllm-legacy"):
            raise ValueError(f"structured_outputs must be 'vllm', 'vllm-legacy' or None, got {structured_outputs!r}")
        self.structured_outputs = structured_outputs
        # never send loopback traffic through an http(s)_proxy from the environment
        handlers = [urllib.request.ProxyHandler({})] if _is_loopback(self.base_url) else []
        self._opener = urllib.request.build_opener(*handlers)
        self._model_lock = threading.Lock()
        if cache_dir is not None:
            from kglightning.llm.backends.cache import ResponseCache

            self.cache = ResponseCache(cache_dir)

    def _api_key(self) -> str | None:
        """The bearer token, read afresh from ``api_key_file`` or ``$api_key_env`` (``None``: send none)."""
        if self.api_key_file is not None:
            path = Path(self.api_key_file)
            if not path.is_file():
                raise FileNotFoundError(f"api_key_file {path} is not a file (give the path of a file holding the key)")
            key = path.read_text(encoding="utf-8").strip()
            if not key:
                raise ValueError(f"api_key_file {self.api_key_file} is empty")
            return key
        key = os.environ.get(self.api_key_env) or None
        if key is None and self.api_key_env != "OPENAI_API_KEY":
            raise ValueError(f"the environment variable {_shown_env_name(self.api_key_env)} is not set (api_key_env)")
        return key

    def __repr__(self) -> str:
        # no network I/O here: the model is shown only once known (given, or already asked from /models)
        return f"{type(self).__name__}(base_url={self.base_url!r}, model={self._model!r})"

    def _ask_server(self) -> None:
        """Fill in the model and the concurrency from ``GET /models`` if not known yet (call with the lock held).

        Without a model the listing is needed, and asked with retries. With one, it is asked once, for the
        concurrency only: if that fails (no ``/models`` route, server not up yet...) the default is used and the
        chat requests themselves retry and report any error.
        """
        if self._model is not None and self._concurrency is not None:
            return
        listing: Any = {}
        try:
            retries = None if self._model is None else 0
            listing = self._request("GET", "/models", None, rng=random.Random(self.retry_seed), max_retries=retries)
        except LLMBackendError:
            if self._model is None:
                raise
        entries = listing.get("data") if isinstance(listing, dict) else None
        if self._model is None:
            try:
                self._model = str(entries[0]["id"])  # type: ignore[index]
            except (KeyError, IndexError, TypeError) as e:
                raise LLMBackendError(f"GET {self.base_url}/models listed no model: {listing!r:.300}") from e
        if self._concurrency is None:
            entry = next((m for m in entries or [] if isinstance(m, dict) and m.get("id") == self._model), {})
            advertised = entry.get("max_concurrency")
            ok = isinstance(advertised, int) and not isinstance(advertised, bool) and advertised >= 1
            self._concurrency = advertised if ok else DEFAULT_MAX_CONCURRENCY

    @property
    def model(self) -> str:
        """The model id sent with each request (asked from ``/models`` once if not given)."""
        with self._model_lock:
            if self._model is None:
                self._ask_server()
            assert self._model is not None
            return self._model

    @property
    def concurrency(self) -> int:
        """Requests in flight at once: ``max_concurrency``, else what ``/models`` advertises (asked once), else 8."""
        with self._model_lock:
            self._ask_server()
            assert self._concurrency is not None
            return self._concurrency

    @property
    def name(self) -> str:
        return self.model

    @property
    def cache_key(self) -> str:
        return f"openai-chat:{self.base_url}:{self.model}"

    def variant_key(self, params: GenerationParams, constrained: bool) -> str:
        """How constrained answers were asked for (a server that ignores one field answers unconstrained)."""
        return f":so-{self.structured_outputs}" if constrained else ""

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

    def _generate_choices(
        self,
        batch: Sequence[list[ChatMessage]],
        params: GenerationParams,
        choices: Sequence[NameChoice],
        on_result: Callable[[int, Generation], None],
    ) -> None:
        if self.structured_outputs is None:
            super()._generate_choices(batch, params, choices, on_result)  # raises, saying how to go on
        bodies = [self.request_body(messages, params) for messages in batch]
        for body, choice in zip(bodies, choices):
            if self.structured_outputs == "vllm":
                body["structured_outputs"] = {"regex": choice.regex()}
            else:
                body["guided_regex"] = choice.regex()
        self._post_all(bodies, on_result)

    def _generate_uncached(
        self,
        batch: Sequence[list[ChatMessage]],
        params: GenerationParams,
        on_result: Callable[[int, Generation], None],
    ) -> None:
        self._post_all([self.request_body(messages, params) for messages in batch], on_result)

    def _post_all(self, bodies: list[dict[str, Any]], on_result: Callable[[int, Generation], None]) -> None:
        """POST every body to ``/chat/completions`` with bounded concurrency, calling ``on_result`` as each ends."""
        from tqdm.auto import tqdm

        batch = bodies
        cancelled = threading.Event()

        def task(i: int) -> Generation | None:
            if cancelled.is_set():
                return None
            rng = random.Random(f"{self.retry_seed}:{i}:{json.dumps(bodies[i], sort_keys=True)}")
            payload = self._request("POST", "/chat/completions", bodies[i], rng=rng, cancelled=cancelled)
            return None if payload is None else parse_chat_completion(payload)

        error: BaseException | None = None
        pool = cf.ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="openai-chat")
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
        max_retries: int | None = None,
    ) -> Any:
        """One request with retries; the decoded JSON body, or ``None`` if ``cancelled`` was set during a backoff."""
        url = self.base_url + path
        last: _Retryable | None = None
        max_retries = self.max_retries if max_retries is None else max_retries
        for attempt in range(max_retries + 1):
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
        tries = f"{max_retries + 1} attempt(s)"
        if last.timed_out:
            raise LLMTimeoutError(f"{method} {url}: {last} ({tries}, timeout_s={self.timeout_s})")
        raise LLMHTTPError(f"{method} {url} failed after {tries}: {last}", url=url, status=last.status)

    def _send(self, method: str, url: str, body: dict[str, Any] | None) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            headers["Content-Type"] = "application/json"
        key = self._api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
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
