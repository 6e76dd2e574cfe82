"""An OpenAI-compatible ``/chat/completions`` server (vLLM, llama.cpp, TGI, OpenAI...) as an LLM backend.

HTTP goes through the standard library (``urllib`` and a thread pool) under the guarantees of
:class:`~kglightning.llm.backends.http_transport.HTTPTransport`: an overall deadline per attempt, redirects never
followed, bodies bounded. Each conversation is one request; up to ``max_concurrency`` are in flight at once (by
default as many as the server advertises in ``GET /models``, at most :data:`MAX_ADVERTISED_CONCURRENCY`, else
:data:`DEFAULT_MAX_CONCURRENCY`). The API key is read from an environment variable or a file, never taken as a
value, so that it cannot end up in a saved config, a printed config, an error message or a log. Connection errors,
timeouts, HTTP 429 and 5xx are retried with exponential backoff and seeded jitter (a ``Retry-After`` header is
honoured up to two minutes); other 4xx, redirects and malformed bodies fail at once. With ``cache_dir`` every response is appended to a
:class:`~kglightning.llm.backends.cache.ResponseCache` as soon as it arrives, so a crashed or interrupted run
resumes by sending only the requests that have no cached answer.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import os
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from jsonargparse.typing import SecretStr

from kglightning.llm.backends.base import ChatMessage, Generation, GenerationParams, LLMBackend, LLMBackendError
from kglightning.llm.backends.chat_response import LLMResponseError, decode_json, parse_chat_completion
from kglightning.llm.backends.http_transport import HTTPTransport, TransportError, is_loopback, shown_url

if TYPE_CHECKING:
    from kglightning.llm.trie.names import NameChoice

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_MAX_CONCURRENCY",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "MAX_ADVERTISED_CONCURRENCY",
    "LLMHTTPError",
    "LLMResponseError",
    "LLMTimeoutError",
    "OpenAIChatBackend",
    "parse_chat_completion",
]

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"  # vLLM's default
DEFAULT_MAX_CONCURRENCY = 8
"""Requests in flight at once when neither ``max_concurrency`` nor the server's ``/models`` listing says."""
MAX_ADVERTISED_CONCURRENCY = 64
"""The most requests in flight that a server's ``/models`` listing can ask for (one thread each)."""
DEFAULT_MAX_RESPONSE_BYTES = 32 * 2**20
"""Longest response body read (a long answer with log-probabilities is a few MB)."""
_MAX_BACKOFF_S = 60.0

log = logging.getLogger(__name__)

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


class OpenAIChatBackend(LLMBackend):
    """Chat completions from an OpenAI-compatible HTTP server.

    One request per conversation, :attr:`concurrency` at a time. When a request fails for good (a 4xx other than
    429, or retries exhausted), no new request is started, the answers already received are kept (in the cache,
    if any) and the error is raised: :class:`LLMHTTPError` (with ``url`` and ``status``) or
    :class:`LLMTimeoutError`, or :class:`LLMResponseError` for a body that is not a chat completion. Rerunning with
    the same ``cache_dir`` then sends only the missing requests. ``timeout_s`` bounds one attempt as a whole, from
    connecting to the last byte of the answer (a server that trickles bytes times out too). Redirects are never
    followed: a 3xx fails with the target in the message, so the key never reaches another host.

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
        timeout_s: deadline of one attempt: connecting, waiting for the answer and reading it.
        max_retries: retries after the first attempt on connection errors, timeouts, 429 and 5xx.
        backoff_s: first retry delay; doubles per retry (capped at 60 s), times a seeded jitter in [0.5, 1].
        max_concurrency: requests in flight at once. ``None``: what the server advertises as ``max_concurrency``
            in its ``/models`` entry for the model (:class:`~kglightning.llm.backends.server.ChatCompletionServer`
            does; at most :data:`MAX_ADVERTISED_CONCURRENCY`), else :data:`DEFAULT_MAX_CONCURRENCY`. More requests
            than the server serves at once only queue there, and queued ones can run past ``timeout_s`` and be
            re-sent.
        cache_dir: folder of a :class:`~kglightning.llm.backends.cache.ResponseCache` (``None``: no cache).
        show_progress: show a tqdm bar over requests.
        retry_seed: seed of the backoff jitter.
        structured_outputs: how to ask the server for structured generation over a set of names
            (:meth:`~kglightning.llm.backends.base.LLMBackend.generate_with_params` with ``choices``): ``"vllm"``
            sends ``{"structured_outputs": {"regex": ...}}`` (vLLM >= 0.12), ``"vllm-legacy"`` sends ``guided_regex``
            (older vLLM); ``None``: the server cannot, and such requests raise :class:`NotImplementedError`.
        max_response_bytes: longest response body accepted (a longer one fails that request, not retried).
        special_tokens: the served model's special-token strings (e.g. from its ``tokenizer_config.json``), broken up
            wherever they occur in messages, besides the common shapes that always are
            (:data:`~kglightning.data.text.GENERIC_SPECIAL`).
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
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        special_tokens: list[str] | None = None,
        api_key: SecretStr | None = None,
    ) -> None:
        if api_key is not None:
            raise ValueError(
                f"{type(self).__name__} does not take the API key as a value (it would be saved in config.yaml, "
                f"printed by --print_config and shown in error messages): {_HOW_TO_PASS_A_KEY}"
            )
        if (max_concurrency is not None and max_concurrency < 1) or max_retries < 0 or timeout_s <= 0:
            raise ValueError("need max_concurrency >= 1 (or None), max_retries >= 0 and timeout_s > 0")
        if max_response_bytes < 1024:
            raise ValueError(f"max_response_bytes must be >= 1024, got {max_response_bytes}")
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
        self.max_response_bytes = max_response_bytes
        self._special = tuple(sorted(set(special_tokens or ()), key=len, reverse=True))
        # never send loopback traffic through an http(s)_proxy from the environment
        self._transport = HTTPTransport(timeout_s, max_response_bytes, use_env_proxy=not is_loopback(self.base_url))
        self._warned_plain_http = False
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
        if not isinstance(entries, list):
            entries = []
        if self._model is None:
            try:
                self._model = str(entries[0]["id"])  # type: ignore[index]
            except (KeyError, IndexError, TypeError) as e:
                raise LLMBackendError(f"GET {self.base_url}/models listed no model: {listing!r:.300}") from e
        if self._concurrency is None:
            entry = next((m for m in entries or [] if isinstance(m, dict) and m.get("id") == self._model), {})
            advertised = entry.get("max_concurrency")
            ok = isinstance(advertised, int) and not isinstance(advertised, bool) and advertised >= 1
            self._concurrency = min(advertised, MAX_ADVERTISED_CONCURRENCY) if ok else DEFAULT_MAX_CONCURRENCY
            if ok and advertised > MAX_ADVERTISED_CONCURRENCY:
                log.warning(
                    "%s/models advertises max_concurrency=%d; using %d (set max_concurrency to choose)",
                    self.base_url, advertised, MAX_ADVERTISED_CONCURRENCY,
                )  # fmt: skip

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

    def special_tokens(self) -> Sequence[str]:
        """The ``special_tokens`` given (the server's tokenizer is not known here)."""
        return self._special

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
            if payload is None:
                return None
            try:
                return parse_chat_completion(payload)
            except LLMResponseError as e:
                raise LLMResponseError(f"POST {shown_url(self.base_url)}/chat/completions: {e}") from e

        error: BaseException | None = None
        pool = cf.ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="openai-chat")
        bar = tqdm(total=len(batch), desc=f"chat ({self.name})", unit="req", disable=not self.show_progress)
        try:
            futures = {pool.submit(task, i): i for i in range(len(batch))}
            for future in cf.as_completed(futures):
                try:
                    gen = future.result()
                except Exception as e:  # any failure of one request: keep the answers of the others
                    if error is None:  # stop starting new requests; those in flight still finish and are kept
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
        last: TransportError | None = None
        max_retries = self.max_retries if max_retries is None else max_retries
        for attempt in range(max_retries + 1):
            if attempt:
                delay = min(self.backoff_s * 2.0 ** min(attempt - 1, 32), _MAX_BACKOFF_S) * (0.5 + 0.5 * rng.random())
                if last is not None and last.retry_after is not None:
                    delay = max(delay, last.retry_after)
                if cancelled is not None:
                    if cancelled.wait(delay):
                        return None
                else:
                    time.sleep(delay)
            try:
                raw = self._transport.send(method, url, *self._encode(body, url))
            except TransportError as e:
                if not e.retryable:
                    raise LLMHTTPError(f"{method} {shown_url(url)}: {e}", url=url, status=e.status, body=e.body) from e
                last = e
                continue
            return decode_json(raw, f"{method} {shown_url(url)}")
        assert last is not None
        tries = f"{max_retries + 1} attempt(s)"
        if last.timed_out:
            raise LLMTimeoutError(f"{method} {shown_url(url)}: {last} ({tries})")
        raise LLMHTTPError(f"{method} {shown_url(url)} failed after {tries}: {last}", url=url, status=last.status)

    def _encode(self, body: dict[str, Any] | None, url: str) -> tuple[bytes | None, dict[str, str]]:
        """The request's bytes and headers (the key read afresh, and only ever sent to ``base_url``'s host)."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8", "replace")  # a lone surrogate: "?"
            headers["Content-Type"] = "application/json"
        key = self._api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
            if urllib.parse.urlsplit(url).scheme == "http" and not is_loopback(url) and not self._warned_plain_http:
                self._warned_plain_http = True
                log.warning("sending the API key to %s over plain http (not encrypted)", shown_url(self.base_url))
        return data, headers
