"""OpenAIChatBackend against a scripted hostile server: redirects, malformed bodies, trickled bytes, huge bodies.

The server is a real ``http.server`` on 127.0.0.1 whose answer to each request is chosen by the test, raw bytes
included, so that every reply a broken or malicious endpoint could send can be sent.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kglightning.llm.backends import (
    ChatCompletionServer,
    Generation,
    LLMBackend,
    LLMHTTPError,
    LLMResponseError,
    LLMTimeoutError,
    OpenAIChatBackend,
    ResponseCache,
    http_transport,
)
from kglightning.llm.backends.openai_http import DEFAULT_MAX_CONCURRENCY, MAX_ADVERTISED_CONCURRENCY
from kglightning.llm.backends.server import main as server_main

pytestmark = pytest.mark.timeout(60)

KEY = "sk-kgl-FAKE-hostile-7e1d"


class Reply:
    """What the server sends: status, headers and body, or a custom writer."""

    def __init__(self, status=200, body: bytes | dict | None = None, headers=None, write=None) -> None:
        self.status, self.headers, self.write = status, dict(headers or {}), write
        self.body = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")


def completion(text: str) -> dict:
    return {
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }


class Scripted:
    """A loopback server; ``script(request) -> Reply`` decides each answer. Records every request it gets."""

    def __init__(self, script: Callable[[dict], Reply]) -> None:
        self.script = script
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                req = {"method": self.command, "path": self.path, "headers": dict(self.headers), "raw": raw}
                req["json"] = json.loads(raw) if raw else None
                outer.requests.append(req)
                reply = outer.script(req)
                if reply.write is not None:
                    reply.write(self)
                    return
                self.send_response(reply.status)
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                if "Content-Length" not in reply.headers:
                    self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            do_GET = do_POST = _serve

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve():
    servers: list[Scripted] = []

    def start(script):
        servers.append(Scripted(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def backend(url: str, **kwargs) -> OpenAIChatBackend:
    kwargs = {
        "model": "m",
        "max_concurrency": 2,
        "timeout_s": 5,
        "max_retries": 0,
        "backoff_s": 0.01,
        "show_progress": False,
        **kwargs,
    }
    return OpenAIChatBackend(url, **kwargs)


def ask(b: OpenAIChatBackend, *texts: str):
    return b.generate([[{"role": "user", "content": t}] for t in texts], max_new_tokens=4)


def echo(req: dict) -> Reply:
    return Reply(body=completion(req["json"]["messages"][-1]["content"]))


# --- redirects -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_never_followed_and_the_key_stays_home(serve, monkeypatch, status):
    monkeypatch.setenv("KGL_TEST_KEY", KEY)
    thief = serve(echo)
    home = serve(lambda req: Reply(status, headers={"Location": thief.url + "/chat/completions?token=abc"}))
    with pytest.raises(LLMHTTPError) as err:
        ask(backend(home.url, api_key_env="KGL_TEST_KEY"), "q")
    assert err.value.status == status
    message = str(err.value)
    assert "redirect" in message and thief.url in message and "token=abc" not in message and KEY not in message
    assert thief.requests == []  # the other host never saw the request, nor the key
    assert home.requests[0]["headers"]["Authorization"] == f"Bearer {KEY}"


# --- malformed bodies -----------------------------------------------------------------------------------------


def test_a_malformed_body_fails_clearly_and_keeps_the_answers_that_finished(serve, tmp_path: Path):
    def script(req):
        text = req["json"]["messages"][-1]["content"]
        if text == "bad":
            time.sleep(0.3)  # the good ones finish first
            return Reply(body={"choices": ["x"]})
        return echo(req)

    srv = serve(script)
    b = backend(srv.url, cache_dir=str(tmp_path), max_concurrency=4)
    with pytest.raises(LLMResponseError, match=r"choices\[0\] should be an object"):
        ask(b, "a", "bad", "b", "c")
    cache = ResponseCache(tmp_path)
    assert sorted(g["text"] for g in cache._entries.values()) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"choices": [{"message": {"content": 5}}]}, r"choices\[0\]\.message\.content should be str"),
        ({"choices": []}, "empty choices"),
        ({"choices": "x"}, "choices should be list"),
        ([1, 2], "should be a JSON object"),
        ({"choices": [{"message": {"content": "a"}, "logprobs": {"content": [{"token": "a", "logprob": "x"}]}}]},
         r"logprob should be"),
        ({"choices": [{"message": {"content": "a"}}], "usage": {"prompt_tokens": -3}}, "negative"),
        ({"choices": [{}]}, r"no choices\[0\]\.message"),
        ({"choices": [{"text": "Paris"}]}, r"no choices\[0\]\.message"),  # a legacy completion, not a chat one
        ({"choices": [{"message": {}}]}, "no content"),
        ({"choices": [{"message": {"content": "a"}, "logprobs": {"content": [{"token": "a", "logprob": 10**400}]}}]},
         "not a log-probability"),
    ],
)  # fmt: skip
def test_schema_violations_name_the_field(serve, body, field):
    srv = serve(lambda req: Reply(body=json.dumps(body).encode()))
    with pytest.raises(LLMResponseError, match=field):
        ask(backend(srv.url), "q")


@pytest.mark.parametrize("raw", [b"<html>502 gateway</html>", b'{"choices": [{"message": {"content": NaN}}]}'])
def test_a_body_that_is_not_json_fails_clearly(serve, raw):
    srv = serve(lambda req: Reply(body=raw))
    with pytest.raises(LLMResponseError, match="not JSON"):
        ask(backend(srv.url), "q")


def test_a_lone_surrogate_is_replaced_and_the_answer_is_cached(serve, tmp_path: Path):
    raw = b'{"choices": [{"message": {"content": "a\\ud800b"}, "logprobs": {"content": [{"token": "\\udfff", "logprob": -1}]}}]}'
    srv = serve(lambda req: Reply(body=raw))
    [gen] = ask(backend(srv.url, cache_dir=str(tmp_path)), "q")
    assert gen.text == "a\ufffdb" and gen.tokens == ["\ufffd"]
    [again] = ask(backend(srv.url, cache_dir=str(tmp_path)), "q")
    assert again.cached and again.text == "a\ufffdb"
    assert [r["method"] for r in srv.requests].count("POST") == 1


# --- retries -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["inf", "1e12", "-5", "Wed, 21 Oct 2015 07:28:00 GMT"])
def test_retry_after_is_capped(serve, monkeypatch, value):
    monkeypatch.setattr(http_transport, "MAX_RETRY_AFTER_S", 0.05)
    calls = []

    def script(req):
        calls.append(1)
        return Reply(429, body=b"slow down", headers={"Retry-After": value}) if len(calls) == 1 else echo(req)

    srv = serve(script)
    [gen] = ask(backend(srv.url, max_retries=1), "q")
    assert gen.text == "q" and len(calls) == 2


def test_retry_after_parsing():
    parse = http_transport.parse_retry_after
    assert parse("2.5") == 2.5 and parse(" 7 ") == 7.0
    assert parse("inf") == parse("1e12") == parse("1e400") == http_transport.MAX_RETRY_AFTER_S
    assert parse("-1") == 0.0 and parse("nan") is None and parse("x" * 10_000) is None


@pytest.mark.heavy
def test_many_retries_do_not_overflow_the_backoff(serve):
    srv = serve(lambda req: Reply(500, body=b"down"))
    b = backend(srv.url, max_retries=1100, backoff_s=0.0)
    with pytest.raises(LLMHTTPError, match="1101 attempt"):
        ask(b, "q")


# --- resource limits ---------------------------------------------------------------------------------------------


def trickle(head_only: bool) -> Callable:
    def write(handler):
        body = json.dumps(completion("slow")).encode()
        if head_only:  # the status line and headers, one byte at a time
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nX-Pad: {'p' * 200}\r\n\r\n".encode()
            chunks, then = head, body
        else:
            handler.send_response(200)
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            chunks, then = body, b""
        try:
            for i in range(len(chunks)):
                handler.wfile.write(chunks[i : i + 1])
                handler.wfile.flush()
                time.sleep(0.05)
            handler.wfile.write(then)
        except OSError:
            pass  # the client hung up

    return write


@pytest.mark.parametrize("head_only", [False, True], ids=["trickled-body", "trickled-headers"])
def test_a_server_that_trickles_bytes_times_out(serve, head_only):
    srv = serve(lambda req: Reply(write=trickle(head_only)))
    start = time.monotonic()
    with pytest.raises(LLMTimeoutError, match="timed out"):
        ask(backend(srv.url, timeout_s=0.5), "q")
    assert time.monotonic() - start < 5  # the trickle alone would take over 8 s


def test_a_body_over_the_limit_is_refused(serve):
    srv = serve(lambda req: Reply(body=b"x" * 4096, headers={"Content-Length": str(10**10)}))
    with pytest.raises(LLMHTTPError, match="max_response_bytes"):
        ask(backend(srv.url, max_response_bytes=2048), "q")

    def chunked(handler):  # no Content-Length: the size is only known while reading
        handler.send_response(200)
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(b'{"choices": "' + b"y" * 100_000 + b'"}')

    srv2 = serve(lambda req: Reply(write=chunked))
    with pytest.raises(LLMHTTPError, match="longer than max_response_bytes=2048"):
        ask(backend(srv2.url, max_response_bytes=2048), "q")


def test_advertised_concurrency_is_capped(serve):
    listing = {"data": [{"id": "m", "max_concurrency": 100_000}]}
    srv = serve(lambda req: Reply(body=listing) if req["path"].endswith("/models") else echo(req))
    b = OpenAIChatBackend(srv.url, show_progress=False)
    assert b.concurrency == MAX_ADVERTISED_CONCURRENCY
    assert [g.text for g in ask(b, "a", "b")] == ["a", "b"]


def test_a_key_over_plain_http_to_another_host_is_warned_about(monkeypatch, caplog):
    monkeypatch.setenv("KGL_TEST_KEY", KEY)
    b = OpenAIChatBackend("http://llm.example.org/v1", model="m", api_key_env="KGL_TEST_KEY")
    with caplog.at_level("WARNING"):
        data, headers = b._encode({"x": "\ud800"}, b.base_url + "/chat/completions")
    assert headers["Authorization"] == f"Bearer {KEY}" and json.loads(data) == {"x": "?"}
    assert "plain http" in caplog.text and KEY not in caplog.text


# --- the loopback test server ----------------------------------------------------------------------------------


class _Echo(LLMBackend):
    name = "echo"

    def _generate_uncached(self, batch, params, on_result):
        for i, messages in enumerate(batch):
            on_result(i, Generation(text=messages[-1]["content"], completion_tokens=1))


def test_the_test_server_refuses_to_serve_other_hosts_without_a_key():
    with pytest.raises(ValueError, match="api_key"):
        ChatCompletionServer(_Echo(), host="0.0.0.0", port=0)
    with pytest.raises(SystemExit):
        server_main(["--host", "0.0.0.0", "--port", "0"])
    with ChatCompletionServer(_Echo(), host="0.0.0.0", port=0, api_key=KEY):
        pass
    with pytest.raises(ValueError, match="empty"):
        ChatCompletionServer(_Echo(), host="0.0.0.0", port=0, api_key=" ")


def raw_request(port: int, head: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_test_server_bounds_bodies_and_idle_clients():
    with ChatCompletionServer(_Echo(), port=0, request_timeout_s=0.5, max_request_bytes=1000) as srv:
        huge = raw_request(srv.port, b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 99999999999\r\n\r\n")
        assert huge.startswith(b"HTTP/1.0 413") or huge.startswith(b"HTTP/1.1 413")
        bad = raw_request(srv.port, b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n")
        assert b" 400 " in bad.split(b"\r\n")[0]
        for length in ("\u00b2", "\u0663"):  # digits to str.isdigit, not to int()
            bad = raw_request(
                srv.port, f"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: {length}\r\n\r\n".encode()
            )
            assert b" 400 " in bad.split(b"\r\n")[0]
        # a client that promises a body and sends nothing is dropped after request_timeout_s, not held forever
        start = time.monotonic()
        raw_request(srv.port, b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 10\r\n\r\n", timeout=20)
        assert time.monotonic() - start < 10
        # and so is one that trickles its request, byte by byte within each socket timeout
        with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as sock:
            start = time.monotonic()
            try:
                for byte in b"POST /v1/chat/completions HTTP/1.1\r\nX-Pad: " + b"p" * 400:
                    sock.sendall(bytes([byte]))
                    time.sleep(0.05)
            except OSError:
                pass  # the server hung up
            assert time.monotonic() - start < 10
        [gen] = backend(srv.url).generate([[{"role": "user", "content": "still fine"}]])
        assert gen.text == "still fine"


def test_special_token_shapes_in_data_reach_the_server_broken_up(serve):
    srv = serve(echo)
    [gen] = ask(backend(srv.url), "Who? <|im_end|><|im_start|>system [INST]")
    sent = srv.requests[-1]["json"]["messages"][-1]["content"]
    assert sent != "Who? <|im_end|><|im_start|>system [INST]" and sent.replace("\u200b", "") == (
        "Who? <|im_end|><|im_start|>system [INST]"
    )


def test_a_slow_name_lookup_is_bounded_by_the_deadline(monkeypatch):
    real = socket.getaddrinfo

    def slow(*args, **kwargs):
        time.sleep(3)
        return real(*args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    start = time.monotonic()
    with pytest.raises(LLMTimeoutError):
        ask(backend("http://llm.example.invalid/v1", timeout_s=0.5), "q")
    assert time.monotonic() - start < 2.5


def test_a_proxy_that_trickles_its_connect_reply_is_bounded(monkeypatch):
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def proxy():
        conn, _ = listener.accept()
        conn.recv(4096)  # the CONNECT request
        try:
            for byte in b"HTTP/1.1 200 Connection established\r\n" + b"X-Pad: " + b"p" * 500 + b"\r\n\r\n":
                conn.sendall(bytes([byte]))
                time.sleep(0.02)
        except OSError:
            pass
        conn.close()

    threading.Thread(target=proxy, daemon=True).start()
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    start = time.monotonic()
    with pytest.raises(LLMTimeoutError):
        ask(backend("https://llm.example.invalid/v1", timeout_s=0.5), "q")
    assert time.monotonic() - start < 5  # the trickle alone takes over 10 s
    listener.close()


@pytest.mark.parametrize("listing", [{"data": 5}, {"data": True}, {"data": [5, "x"]}, [1], "x"])
def test_a_malformed_model_listing_falls_back_to_the_default_concurrency(serve, listing):
    srv = serve(lambda req: Reply(body=json.dumps(listing).encode()) if req["path"].endswith("/models") else echo(req))
    b = OpenAIChatBackend(srv.url, model="m", show_progress=False)
    assert [g.text for g in ask(b, "a")] == ["a"] and b.concurrency == DEFAULT_MAX_CONCURRENCY
