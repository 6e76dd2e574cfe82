"""One HTTP exchange with guarantees that urllib alone does not give: a deadline, no redirects, a size bound.

:class:`HTTPTransport` sends one request and returns the raw body. Compared with a plain ``urlopen``:

- **an overall deadline.** urllib's ``timeout`` bounds each socket operation, so a server that sends one byte a
  second never times out. Here a timer shuts the request's socket down once ``timeout_s`` has passed since the
  request started (connecting, sending, waiting and reading all count), and the attempt ends as timed out.
- **no redirects.** A 3xx answer is returned as an error and never followed: following one would send the
  ``Authorization`` header to wherever the ``Location`` points (another host, or plain http), turn a POST into a
  GET, and cache the other host's reply as the answer.
- **bounded bodies.** A body longer than ``max_response_bytes`` (by its ``Content-Length`` or as read) is refused;
  an error body is read up to 4 KiB.
- **no proxy for loopback.** Requests to 127.0.0.1 or localhost never go through an ``http(s)_proxy`` of the
  environment.

Why not the ``openai`` client: it follows redirects by default, its timeouts are per socket operation too, and its
retry jitter is not seeded (docs/guides/security.md, "Security and reliability").
"""

from __future__ import annotations

import concurrent.futures as cf
import email.utils
import http.client
import ipaddress
import math
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MAX_RETRY_AFTER_S",
    "HTTPTransport",
    "TransportError",
    "is_loopback",
    "is_loopback_host",
    "parse_retry_after",
    "shown_url",
]

MAX_RETRY_AFTER_S = 120.0
"""A server's ``Retry-After`` is honoured up to this many seconds (a longer one waits this long)."""

_ERROR_BODY_BYTES = 4096
_CHUNK = 1 << 16


@dataclass
class TransportError(Exception):
    """One attempt failed. ``status`` is the HTTP status (``None`` without an answer); ``retryable`` says whether
    trying again may help (connection errors, timeouts, 429, 5xx); ``retry_after`` is the server's wish, capped."""

    message: str
    status: int | None = None
    retryable: bool = False
    timed_out: bool = False
    retry_after: float | None = None
    body: str = ""

    def __str__(self) -> str:
        return self.message


def shown_url(url: str) -> str:
    """``url`` without user info, query or fragment (for messages: a redirect target may carry a token).

    >>> shown_url("https://user:pw@evil.example:8443/v1/x?token=abc#f")
    'https://evil.example:8443/v1/x'
    """
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None else f"{host}:{port}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (seconds or an HTTP date), capped at :data:`MAX_RETRY_AFTER_S`.

    ``None`` when absent or unreadable; an infinite or huge value waits the cap, a negative one or a past date 0.

    >>> parse_retry_after("3"), parse_retry_after("inf"), parse_retry_after("1e12"), parse_retry_after("-1")
    (3.0, 120.0, 120.0, 0.0)
    >>> parse_retry_after("nan"), parse_retry_after("soon"), parse_retry_after(None)
    (None, None, None)
    >>> parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", now=0.0)
    10.0
    """
    if value is None:
        return None
    value = value.strip()[:64]
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine: ``localhost``, a loopback address, or the unspecified address
    (``0.0.0.0``, ``::``, which servers print and which connects to this machine).

    >>> is_loopback("http://0.0.0.0:8000/v1"), is_loopback("http://[::1]:8000"), is_loopback("https://api.x.com")
    (True, True, False)
    """
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        if ipaddress.ip_address(host).is_unspecified:
            return True
    except ValueError:
        pass
    return is_loopback_host(host)


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (``127.0.0.1``, ``::1``).

    >>> is_loopback_host("127.0.0.2"), is_loopback_host("::1"), is_loopback_host("0.0.0.0")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Deadline:
    """The end of one attempt: :meth:`expire` (run by a timer) shuts the attempt's socket down."""

    def __init__(self, seconds: float) -> None:
        self.expired = False
        self.ends = time.monotonic() + seconds
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def remaining(self) -> float:
        """Seconds left (``TimeoutError`` once none are)."""
        left = self.ends - time.monotonic()
        if left <= 0 or self.expired:
            raise TimeoutError("the request's deadline passed")
        return left

    def attach(self, sock: socket.socket) -> None:
        # the socket itself, not the connection: urllib drops the connection's reference once the headers are read,
        # while the response goes on reading through a file over the same socket
        with self._lock:
            self._sock = sock
            if self.expired:
                raise TimeoutError("deadline passed while connecting")

    def expire(self) -> None:
        with self._lock:
            self.expired = True
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked read, which then fails or sees the end
            except OSError:
                pass


_current = threading.local()
_resolver = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="resolve")


def _attach(conn: http.client.HTTPConnection) -> None:
    deadline: _Deadline | None = getattr(_current, "deadline", None)
    if deadline is not None and conn.sock is not None:
        deadline.attach(conn.sock)


def _create_connection(
    address: tuple[str, int], timeout: Any = None, source_address: Any = None, *args: Any, **kwargs: Any
) -> socket.socket:
    """``socket.create_connection`` under the attempt's deadline: the name lookup (in a worker thread, waited on for
    the time left), and each connect (attached to the deadline before it starts, so that a proxy's ``CONNECT`` and
    the TLS handshake that follow are bounded too)."""
    deadline: _Deadline | None = getattr(_current, "deadline", None)
    if deadline is None:
        return socket.create_connection(address, timeout, source_address)
    host, port = address
    lookup = _resolver.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    try:
        infos = lookup.result(timeout=deadline.remaining())
    except cf.TimeoutError:
        raise TimeoutError(f"looking up {host} took longer than the request's deadline") from None
    error: OSError | None = None
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            deadline.attach(sock)
            sock.settimeout(min(timeout, deadline.remaining()) if isinstance(timeout, (int, float)) else None)
            if source_address:
                sock.bind(source_address)
            sock.connect(addr)
            sock.settimeout(timeout if isinstance(timeout, (int, float)) else None)
            return sock
        except OSError as e:  # TimeoutError included
            error = e
            sock.close()
    raise error or OSError(f"no address for {host}")


class _Timed:
    """Connections whose socket is made, and attached to the attempt's deadline, by :func:`_create_connection`."""

    sock: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _create_connection

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        _attach(self)  # type: ignore[arg-type]  # for HTTPS, the TLS socket that replaced the raw one


class _TimedHTTPConnection(_Timed, http.client.HTTPConnection):
    pass


class _TimedHTTPSConnection(_Timed, http.client.HTTPSConnection):
    pass


class _TimedHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_TimedHTTPConnection, req)


class _TimedHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_TimedHTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


class HTTPTransport:
    """Sends one request at a time per thread, under the guarantees in the module docstring.

    Args:
        timeout_s: deadline of one attempt, from its start to the last byte of the body.
        max_response_bytes: longest body accepted.
        use_env_proxy: route through an ``http(s)_proxy`` of the environment (never done for loopback URLs).
    """

    def __init__(self, timeout_s: float, max_response_bytes: int, use_env_proxy: bool = True) -> None:
        if timeout_s <= 0 or max_response_bytes < 1:
            raise ValueError("need timeout_s > 0 and max_response_bytes >= 1")
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        handlers: list[Any] = [_TimedHTTPHandler(), _TimedHTTPSHandler(), _NoRedirects()]
        if not use_env_proxy:
            handlers.append(urllib.request.ProxyHandler({}))
        self._opener = urllib.request.build_opener(*handlers)

    def send(self, method: str, url: str, data: bytes | None, headers: dict[str, str]) -> bytes:
        """The body of a 2xx answer; raises :class:`TransportError` for anything else."""
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        deadline = _Deadline(self.timeout_s)
        timer = threading.Timer(self.timeout_s, deadline.expire)
        timer.daemon = True
        _current.deadline = deadline
        timer.start()
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                body = self._read(resp, url)
        except urllib.error.HTTPError as e:
            raise self._status_error(e, url) from e
        except TransportError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as e:
            # URLError, timeouts, resets, a shut-down socket; ValueError: http.client on a garbled status line
            reason = getattr(e, "reason", e)
            if deadline.expired or isinstance(reason, TimeoutError):
                raise TransportError(f"timed out (timeout_s={self.timeout_s})", retryable=True, timed_out=True) from e
            raise TransportError(f"connection error: {reason!r:.300}", retryable=True) from e
        finally:
            timer.cancel()
            _current.deadline = None
        if deadline.expired:  # the socket was shut down mid-body and the read ended early
            raise TransportError(f"timed out (timeout_s={self.timeout_s})", retryable=True, timed_out=True)
        return body

    def _read(self, resp: http.client.HTTPResponse, url: str) -> bytes:
        declared = resp.headers.get("Content-Length")
        length = (declared or "").strip()
        if length.isascii() and length.isdigit() and int(length) > self.max_response_bytes:
            raise TransportError(
                f"{shown_url(url)}: the response declares {int(length)} bytes, more than max_response_bytes="
                f"{self.max_response_bytes}"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            chunk = resp.read(_CHUNK)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > self.max_response_bytes:
                raise TransportError(
                    f"{shown_url(url)}: the response is longer than max_response_bytes={self.max_response_bytes}"
                )
            chunks.append(chunk)

    def _status_error(self, e: urllib.error.HTTPError, url: str) -> TransportError:
        try:
            text = e.read(_ERROR_BODY_BYTES).decode("utf-8", "replace")[:500]
        except (OSError, http.client.HTTPException, ValueError):
            text = ""
        if 300 <= e.code < 400:
            location = e.headers.get("Location") if e.headers is not None else None
            target = "elsewhere" if not location else f"to {shown_url(urllib.parse.urljoin(url, location))}"
            return TransportError(
                f"{shown_url(url)} answered HTTP {e.code}, a redirect {target}. API requests never follow "
                "redirects (the API key would go with them, and a POST would become a GET): set base_url to the "
                "address that answers directly",
                status=e.code,
            )
        retryable = e.code == 429 or e.code >= 500
        retry_after = parse_retry_after(e.headers.get("Retry-After")) if e.headers is not None else None
        return TransportError(
            f"HTTP {e.code}: {text}", status=e.code, retryable=retryable, retry_after=retry_after, body=text
        )
