"""A small OpenAI-compatible HTTP server (``/v1/chat/completions``, ``/v1/models``) over any LLM backend.

Meant for tests and local experiments, built on the standard library's ``ThreadingHTTPServer``; requests are
generated one at a time (generation holds a lock), and the server says so: each ``/v1/models`` entry carries
``"max_concurrency": 1``, which :class:`~kglightning.llm.backends.openai_http.OpenAIChatBackend` follows by default,
so that its requests do not queue here past their timeout. A queued request whose client has gone (timed out,
interrupted) is dropped before generation starts (:attr:`ChatCompletionServer.abandoned_count`). For throughput,
serve models with vLLM and point the client at it. Fault injection for tests: an artificial
delay (:attr:`ChatCompletionServer.delay_s`, or per request :attr:`~ChatCompletionServer.delay_next`), scripted
error statuses (:attr:`~ChatCompletionServer.fail_next`) and a simulated crash after ``k`` answers
(:attr:`~ChatCompletionServer.fail_after`).

From a shell::

    python -m kglightning.llm.backends.server --model bundled:smollm2 --port 8000
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import select
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kglightning.llm.backends.base import GenerationParams, LLMBackend, _check_messages, _normalize_stop
from kglightning.llm.backends.http_transport import is_loopback_host

__all__ = ["ChatCompletionServer", "main"]

log = logging.getLogger(__name__)


class _BadRequest(ValueError):
    pass


def params_from_body(body: dict[str, Any]) -> GenerationParams:
    """Decoding settings from an OpenAI chat-completion request body (OpenAI defaults where absent).

    >>> params_from_body({"max_tokens": 5, "temperature": 0, "stop": "\\n", "logprobs": True})
    GenerationParams(max_new_tokens=5, temperature=0.0, top_p=1.0, stop=('\\n',), logprobs=True, seed=0)
    """
    if body.get("stream"):
        raise _BadRequest("streaming is not supported by this server")
    if int(body.get("n") or 1) != 1:
        raise _BadRequest("only n=1 is supported")
    try:
        return GenerationParams(
            max_new_tokens=int(body.get("max_completion_tokens") or body.get("max_tokens") or 256),
            temperature=float(1.0 if body.get("temperature") is None else body["temperature"]),
            top_p=float(1.0 if body.get("top_p") is None else body["top_p"]),
            stop=_normalize_stop(body.get("stop")),
            logprobs=bool(body.get("logprobs")),
            seed=int(body.get("seed") or 0),
        )
    except (TypeError, ValueError) as e:
        raise _BadRequest(str(e)) from e


class ChatCompletionServer:
    """Serve ``backend`` under the OpenAI chat-completions schema.

    Args:
        backend: any :class:`~kglightning.llm.backends.base.LLMBackend` (typically a ``LocalHFBackend``).
        host: interface to bind (loopback by default). Any other interface needs ``api_key`` (or
            ``allow_unauthenticated=True``): the server answers whoever reaches it.
        port: TCP port; ``0`` picks a free one (read it back from :attr:`port`).
        model_name: the model id served under ``/v1/models``; default ``backend.name``.
        delay_s: seconds to sleep before answering each chat request.
        api_key: if given, every request must carry ``Authorization: Bearer <api_key>`` (else HTTP 401), as with
            vLLM's ``--api-key``; for tests of clients.
        allow_unauthenticated: bind a non-loopback ``host`` without ``api_key`` all the same.
        request_timeout_s: how long a client may take to send a request (line, headers and body; a slow or silent
            client is dropped), and the socket timeout of each connection.
        max_request_bytes: longest request body read; a longer one is answered 413 without reading it.

    Example:
        >>> from kglightning.llm.backends.base import Generation
        >>> class Echo(LLMBackend):
        ...     name = "echo"
        ...     def _generate_uncached(self, batch, params, on_result):
        ...         on_result(0, Generation(text=batch[0][-1]["content"], completion_tokens=1))
        >>> from kglightning.llm.backends.openai_http import OpenAIChatBackend
        >>> with ChatCompletionServer(Echo(), port=0) as server:
        ...     client = OpenAIChatBackend(server.url, show_progress=False)
        ...     [g.text for g in client.generate([[{"role": "user", "content": "hi"}]])], client.model
        (['hi'], 'echo')
    """

    max_concurrency = 1
    """Chat requests generated at once (advertised in ``/v1/models``; more wait for the generation lock)."""

    def __init__(
        self,
        backend: LLMBackend,
        host: str = "127.0.0.1",
        port: int = 8000,
        model_name: str | None = None,
        delay_s: float = 0.0,
        api_key: str | None = None,
        *,
        allow_unauthenticated: bool = False,
        request_timeout_s: float = 30.0,
        max_request_bytes: int = 8 * 2**20,
    ) -> None:
        if api_key is not None and not api_key.strip():
            raise ValueError("api_key is empty: give a key, or None for no key")
        if api_key is None and not allow_unauthenticated and not is_loopback_host(host):
            raise ValueError(
                f"binding {host!r} (not loopback) serves the model to anyone who can reach it: give an api_key "
                "(--api-key-env on the command line) or allow_unauthenticated=True (--allow-unauthenticated)"
            )
        self.request_timeout_s = request_timeout_s
        self.max_request_bytes = max_request_bytes
        self.backend = backend
        self.model_name = model_name or backend.name
        self.delay_s = delay_s
        self._api_key = api_key
        self.delay_next: list[float] = []  # per-request delays, used (and removed) before delay_s
        self.fail_next: list[int] = []  # HTTP statuses to answer the next chat requests with, in order
        self.fail_after: int | None = None  # answer 500 to every chat request once this many were admitted
        self.request_count = 0  # chat requests received
        self.admitted_count = 0  # chat requests that passed the injected faults and went to generation
        self.completed_count = 0  # chat requests answered with a completion
        self.abandoned_count = 0  # admitted chat requests dropped before generation: their client had gone
        self.models_count = 0  # GET /models requests received
        self.in_flight = 0  # chat requests being handled now
        self.max_in_flight = 0  # the most chat requests handled at once so far
        self._state = threading.Lock()
        self._generate_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._httpd = ThreadingHTTPServer((host, port), _make_handler(self))
        self._httpd.daemon_threads = True

    @property
    def host(self) -> str:
        return str(self._httpd.server_address[0])

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Base URL for clients, ``http://host:port/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def serve_forever(self) -> None:
        """Serve in this thread until :meth:`stop`."""
        log.info("serving %s at %s", self.model_name, self.url)
        self._httpd.serve_forever(poll_interval=0.1)

    def start(self) -> ChatCompletionServer:
        """Serve in a daemon thread; returns ``self``."""
        self._thread = threading.Thread(target=self.serve_forever, name="chat-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> ChatCompletionServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # request handling (called from handler threads)

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header value passes (always, when the server has no ``api_key``)."""
        if self._api_key is None:
            return True
        return hmac.compare_digest((header or "").encode(), f"Bearer {self._api_key}".encode())

    def handle_chat(
        self, body: dict[str, Any], client_gone: Callable[[], bool] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Answer one chat-completion request body: ``(status, response body)``.

        Args:
            body: the decoded JSON request body.
            client_gone: called once the request holds the generation lock; if it returns ``True`` the request is
                dropped (HTTP 499, counted in :attr:`abandoned_count`) instead of generated for nobody.
        """
        with self._state:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return self._handle_chat(body, client_gone)
        finally:
            with self._state:
                self.in_flight -= 1

    def _handle_chat(self, body: dict[str, Any], client_gone: Callable[[], bool] | None) -> tuple[int, dict[str, Any]]:
        with self._state:
            self.request_count += 1
            delay = self.delay_next.pop(0) if self.delay_next else self.delay_s
            status = self.fail_next.pop(0) if self.fail_next else 0
        if delay > 0:
            time.sleep(delay)
        if status:
            return status, _error(f"injected failure (HTTP {status})", "server_error")
        with self._state:  # admit at most fail_after requests for generation, even when they run concurrently
            if self.fail_after is not None and self.admitted_count >= self.fail_after:
                return 500, _error("injected crash: no more answers", "server_error")
            self.admitted_count += 1
        try:
            messages = body.get("messages")
            _check_messages(messages)
            params = params_from_body(body)
        except (TypeError, ValueError) as e:
            return 400, _error(str(e), "invalid_request_error")
        try:
            with self._generate_lock:
                if client_gone is not None and client_gone():
                    with self._state:
                        self.abandoned_count += 1
                    return 499, _error("the client closed the connection before generation", "client_closed")
                gen = self.backend.generate_with_params([messages], params)[0]
        except Exception as e:  # report, do not kill the server
            log.exception("generation failed")
            return 500, _error(f"generation failed: {e!r}", "server_error")
        with self._state:
            self.completed_count += 1
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": gen.text},
            "finish_reason": gen.finish_reason,
            "logprobs": None,
        }
        if params.logprobs and gen.token_logprobs is not None:
            tokens = gen.tokens or [""] * len(gen.token_logprobs)
            choice["logprobs"] = {
                "content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
                    for t, lp in zip(tokens, gen.token_logprobs)
                ]
            }
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": {
                "prompt_tokens": gen.prompt_tokens,
                "completion_tokens": gen.completion_tokens,
                "total_tokens": gen.prompt_tokens + gen.completion_tokens,
            },
        }

    def models(self) -> dict[str, Any]:
        """The ``/v1/models`` listing; each entry adds ``max_concurrency`` to OpenAI's fields."""
        entry = {"id": self.model_name, "object": "model", "created": 0, "owned_by": "kglightning"}
        return {"object": "list", "data": [{**entry, "max_concurrency": self.max_concurrency}]}


def _peer_closed(sock: socket.socket) -> bool:
    """Whether the client closed its end: the socket reads as end-of-file (or fails) without blocking."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):  # reset by the peer, or already closed
        return True


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": None}}


def _make_handler(app: ChatCompletionServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "kglightning-chat/0.1"
        timeout = app.request_timeout_s  # applied to each connection's socket by socketserver

        def handle_one_request(self) -> None:
            # one deadline for reading the whole request: a per-read timeout alone lets a trickling client hold a
            # thread forever; do_GET/do_POST call _request_read() once the request is in
            self._reading = threading.Timer(app.request_timeout_s, self._drop)
            self._reading.daemon = True
            self._reading.start()
            try:
                super().handle_one_request()
            finally:
                self._reading.cancel()

        def _drop(self) -> None:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _request_read(self) -> None:
            self._reading.cancel()

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8")
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (e.g. timed out)
                log.debug("client went away before the answer")

        def _authorized(self) -> bool:
            if app.authorized(self.headers.get("Authorization")):
                return True
            self._reply(401, _error("missing or wrong API key", "authentication_error"))
            return False

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            self._request_read()
            path = self.path.split("?")[0].rstrip("/")
            if path in ("/health", "/v1/health"):
                self._reply(200, {"status": "ok"})
            elif not self._authorized():
                return
            elif path in ("/v1/models", "/models"):
                with app._state:
                    app.models_count += 1
                self._reply(200, app.models())
            else:
                self._reply(404, _error(f"no route {self.path}", "not_found"))

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?")[0].rstrip("/")
            length = (self.headers.get("Content-Length") or "0").strip()
            valid = length.isascii() and length.isdigit()
            if not valid or int(length) > app.max_request_bytes:
                self._request_read()
                self.close_connection = True  # the body is not read, so the connection cannot be reused
                status, what = (400, "no valid Content-Length") if not valid else (413, "body too long")
                self._reply(status, _error(f"{what} (at most {app.max_request_bytes} bytes)", "invalid_request_error"))
                return
            # read the body before any answer, so that the client gets the answer (not a connection reset)
            raw = self.rfile.read(int(length))
            self._request_read()
            if len(raw) < int(length):  # the client went silent, or the deadline cut it off
                self.close_connection = True
                return
            if not self._authorized():
                return
            if path not in ("/v1/chat/completions", "/chat/completions"):
                self._reply(404, _error(f"no route {self.path}", "not_found"))
                return
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("the request body must be a JSON object")
            except ValueError as e:
                self._reply(400, _error(f"bad JSON body: {e}", "invalid_request_error"))
                return
            self._reply(*app.handle_chat(body, client_gone=lambda: _peer_closed(self.connection)))

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            log.debug("%s %s", self.address_string(), format % args)

    return Handler


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m kglightning.llm.backends.server --model PATH --port 8000``: serve a local model."""
    from kglightning.llm.backends.local_hf import BUNDLED_SMOLLM2, LocalHFBackend

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=BUNDLED_SMOLLM2, help="model folder, .gguf file or bundled:smollm2")
    parser.add_argument("--gguf-file", default=None, help="GGUF file name inside --model")
    parser.add_argument("--host", default="127.0.0.1", help="interface; not loopback needs --api-key-env")
    parser.add_argument(
        "--api-key-env", default=None, help="environment variable holding the key that clients must send"
    )
    parser.add_argument("--allow-unauthenticated", action="store_true", help="serve a non-loopback host keyless")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "float16", "bfloat16"])
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--delay-s", type=float, default=0.0, help="artificial delay before each answer")
    args = parser.parse_args(argv)
    api_key = None
    if args.api_key_env is not None:
        api_key = os.environ.get(args.api_key_env) or parser.error(f"--api-key-env: ${args.api_key_env} is not set")
    if api_key is None and not args.allow_unauthenticated and not is_loopback_host(args.host):
        parser.error(f"--host {args.host} is not loopback: give --api-key-env (or --allow-unauthenticated)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    backend = LocalHFBackend(args.model, args.gguf_file, device=args.device, dtype=args.dtype, show_progress=False)
    backend.load()
    server = ChatCompletionServer(
        backend, args.host, args.port, args.served_model_name, args.delay_s, api_key,
        allow_unauthenticated=args.allow_unauthenticated,
    )  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
