"""OpenAIChatBackend against the loopback ChatCompletionServer serving the tiny local model.

Everything runs over real HTTP on 127.0.0.1 (no mocking): the server counts the requests it receives and can
inject delays, error statuses and a crash after ``k`` answers.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kglightning.llm.backends import (
    ChatCompletionServer,
    Generation,
    LLMBackend,
    LLMHTTPError,
    LLMTimeoutError,
    OpenAIChatBackend,
    ResponseCache,
)
from kglightning.llm.backends.openai_http import DEFAULT_MAX_CONCURRENCY

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture
def server(tiny_backend):
    with ChatCompletionServer(tiny_backend, port=0, model_name="tiny-llama") as srv:
        yield srv


def client(url: str, **kwargs) -> OpenAIChatBackend:
    kwargs = {"timeout_s": 10, "max_retries": 2, "backoff_s": 0.01, "show_progress": False, **kwargs}
    return OpenAIChatBackend(url, **kwargs)


class SlowEcho(LLMBackend):
    """Echoes the last message after ``delay_s`` and once :attr:`release` is set; counts generated requests."""

    name = "slow-echo"

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls = 0
        self.release = threading.Event()
        self.release.set()

    def _generate_uncached(self, batch, params, on_result):
        self.calls += len(batch)
        self.release.wait(30)
        time.sleep(self.delay_s)
        for i, messages in enumerate(batch):
            on_result(i, Generation(text=messages[-1]["content"], completion_tokens=1))


def free_port_url() -> str:
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def wait_until(condition, what: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.02)


def test_http_matches_local_greedy(server, tiny_backend, make_conversations):
    convs = make_conversations(5)
    remote = client(server.url, max_concurrency=3)
    assert remote.model == "tiny-llama"  # asked from /v1/models
    got = remote.generate(convs, max_new_tokens=8, logprobs=True)
    want = tiny_backend.generate(convs, max_new_tokens=8, logprobs=True)
    assert [g.text for g in got] == [g.text for g in want]
    for g, w in zip(got, want):
        assert (g.prompt_tokens, g.completion_tokens, g.finish_reason) == (
            w.prompt_tokens,
            w.completion_tokens,
            w.finish_reason,
        )
        assert g.tokens == w.tokens
        assert g.token_logprobs == pytest.approx(w.token_logprobs, abs=1e-4)
    assert server.request_count == 5
    plain = remote.generate(convs[:1], max_new_tokens=3, stop="\n")[0]
    assert plain.token_logprobs is None and plain.tokens is None


def test_settings_from_environment(server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_MODEL", "tiny-llama")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    backend = OpenAIChatBackend(show_progress=False)
    assert (backend.base_url, backend.model) == (server.url, "tiny-llama")
    assert backend.generate([[{"role": "user", "content": "hi"}]], max_new_tokens=2)[0].completion_tokens == 2
    assert "sk-test" not in backend.cache_key


def test_timeout_is_retried_then_raised(server):
    server.delay_next = [1.0, 1.0]
    backend = client(server.url, model="tiny-llama", timeout_s=0.25, max_retries=1)
    start = time.perf_counter()
    with pytest.raises(LLMTimeoutError, match=rf"{server.url}/chat/completions.*2 attempt"):
        backend.generate([[{"role": "user", "content": "hi"}]], max_new_tokens=2)
    assert time.perf_counter() - start < 1.8  # gave up on each attempt after timeout_s, not after 1 s
    assert server.request_count == 2


def test_timeout_then_success(server):
    server.delay_next = [1.0]
    backend = client(server.url, model="tiny-llama", timeout_s=0.25, max_retries=2)
    gen = backend.generate([[{"role": "user", "content": "hi"}]], max_new_tokens=2)[0]
    assert gen.completion_tokens == 2
    assert server.request_count == 2


def test_5xx_and_429_are_retried(server):
    server.fail_next = [503, 500, 429]
    gen = client(server.url, model="tiny-llama", max_retries=3).generate(
        [[{"role": "user", "content": "hi"}]], max_new_tokens=2
    )[0]
    assert gen.completion_tokens == 2
    assert server.request_count == 4


def test_retries_exhausted_names_url_and_status(server):
    server.fail_next = [502, 502, 502]
    with pytest.raises(LLMHTTPError, match=rf"POST {server.url}/chat/completions failed after 3.*HTTP 502") as info:
        client(server.url, model="tiny-llama", max_retries=2).generate([[{"role": "user", "content": "hi"}]])
    assert info.value.status == 502
    assert server.request_count == 3


def test_4xx_is_not_retried(server):
    server.fail_next = [400]
    with pytest.raises(LLMHTTPError, match="HTTP 400") as info:
        client(server.url, model="tiny-llama", max_retries=3).generate([[{"role": "user", "content": "hi"}]])
    assert info.value.status == 400 and info.value.url.startswith(server.url)
    assert server.request_count == 1


def test_connection_refused_is_retried_then_raised():
    url = free_port_url()
    with pytest.raises(LLMHTTPError, match=rf"{url}/chat/completions failed after 2 attempt.*connection error"):
        client(url, model="m", max_retries=1).generate([[{"role": "user", "content": "hi"}]])


def test_concurrency_limit(server):
    server.delay_s = 0.3
    backend = client(server.url, model="tiny-llama", max_concurrency=2)
    convs = [[{"role": "user", "content": f"q{i}"}] for i in range(6)]
    start = time.perf_counter()
    gens = backend.generate(convs, max_new_tokens=1)
    elapsed = time.perf_counter() - start
    assert len(gens) == 6 and server.max_in_flight == 2
    assert elapsed < 6 * 0.3  # the delays overlapped


def test_repr_does_no_network_io():
    with ChatCompletionServer(SlowEcho(), port=0) as server:
        lazy = client(server.url)  # no model given: it is asked from /models when a request needs it
        assert repr(lazy) == f"OpenAIChatBackend(base_url={server.url!r}, model=None)" and str(lazy) == repr(lazy)
        assert server.models_count == 0 and server.request_count == 0
        assert lazy.model == "slow-echo" and server.models_count == 1
        assert repr(lazy) == f"OpenAIChatBackend(base_url={server.url!r}, model='slow-echo')"
        assert server.models_count == 1
    down = client(free_port_url(), max_retries=0)
    assert "model=None" in repr(down)  # neither raises nor retries


def test_default_client_follows_the_servers_concurrency():
    backend = SlowEcho(delay_s=0.2)
    with ChatCompletionServer(backend, port=0) as server:
        assert server.models()["data"][0]["max_concurrency"] == 1
        default = client(server.url, timeout_s=5, max_retries=0)  # max_concurrency=None: ask the server
        convs = [[{"role": "user", "content": f"q{i}"}] for i in range(6)]
        assert [g.text for g in default.generate(convs, max_new_tokens=1)] == [f"q{i}" for i in range(6)]
        assert default.concurrency == 1 and server.max_in_flight == 1
        assert server.request_count == 6 and server.models_count == 1
        assert client(server.url, model="slow-echo", max_concurrency=3).concurrency == 3  # no need to ask
        assert server.models_count == 1


def test_default_concurrency_when_the_server_does_not_say():
    class Plain(ChatCompletionServer):  # like OpenAI or vLLM: /models has no max_concurrency
        def models(self):
            listing = super().models()
            for entry in listing["data"]:
                entry.pop("max_concurrency")
            return listing

    with Plain(SlowEcho(), port=0) as server:
        backend = client(server.url, model="slow-echo")
        assert backend.concurrency == DEFAULT_MAX_CONCURRENCY == 8 and server.models_count == 1


def test_server_skips_requests_whose_client_gave_up():
    backend = SlowEcho()
    backend.release.clear()  # the first request holds the generation lock until the test releases it
    with ChatCompletionServer(backend, port=0) as server:
        impatient = client(server.url, model="slow-echo", timeout_s=0.3, max_retries=0, max_concurrency=4)
        convs = [[{"role": "user", "content": f"q{i}"}] for i in range(4)]
        with pytest.raises(LLMTimeoutError):
            impatient.generate(convs, max_new_tokens=1)
        backend.release.set()
        wait_until(lambda: server.request_count == 4 and server.in_flight == 0, "the server to finish")
        # at most the request already generating when its client left was generated; the queued ones were skipped
        assert backend.calls <= 1 and backend.calls + server.abandoned_count == 4
        assert server.completed_count == backend.calls


def test_resume_after_crash_sends_only_missing_requests(server, make_conversations, tmp_path: Path):
    convs = make_conversations(8)
    reference = client(server.url, model="tiny-llama").generate(convs, max_new_tokens=6, logprobs=True)
    server.request_count = server.admitted_count = 0

    server.fail_after = 3  # the server "dies" after 3 answers
    crashed = client(server.url, model="tiny-llama", max_retries=0, max_concurrency=2, cache_dir=str(tmp_path))
    with pytest.raises(LLMHTTPError, match="HTTP 500"):
        crashed.generate(convs, max_new_tokens=6, logprobs=True)
    assert len(ResponseCache(tmp_path)) == 3

    server.fail_after = None
    before = server.request_count
    resumed = client(server.url, model="tiny-llama", cache_dir=str(tmp_path))  # a fresh process would do the same
    gens = resumed.generate(convs, max_new_tokens=6, logprobs=True)
    assert server.request_count - before == 5
    assert sum(g.cached for g in gens) == 3
    assert [g.text for g in gens] == [g.text for g in reference]
    assert [g.token_logprobs for g in gens] == [g.token_logprobs for g in reference]
    # a third run is served entirely from the cache
    again = client(server.url, model="tiny-llama", cache_dir=str(tmp_path)).generate(convs, max_new_tokens=6)
    assert server.request_count - before == 5 + 8  # max_new_tokens and logprobs are part of the key
    assert not any(g.cached for g in again)


def test_torn_last_cache_line_is_tolerated(server, make_conversations, tmp_path: Path):
    convs = make_conversations(4)
    first = client(server.url, model="tiny-llama", cache_dir=str(tmp_path)).generate(convs, max_new_tokens=4)
    path = tmp_path / "responses.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines) == 4
    # a crash in the middle of writing the 4th line
    path.write_bytes(b"".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    before = server.request_count
    backend = client(server.url, model="tiny-llama", cache_dir=str(tmp_path))
    assert backend.cache.n_corrupt == 1 and len(backend.cache) == 3
    gens = backend.generate(convs, max_new_tokens=4)
    assert server.request_count - before == 1
    assert [g.text for g in gens] == [g.text for g in first]
    # the re-sent answer went on a fresh line: the file reads back with only the torn line skipped
    reread = ResponseCache(tmp_path)
    assert (len(reread), reread.n_corrupt) == (4, 1)
    # garbage appended after complete lines is skipped too, and nothing is re-sent
    with open(path, "ab") as f:
        f.write(b'{"key": "0f0f", "generation": {"te')
    again = client(server.url, model="tiny-llama", cache_dir=str(tmp_path)).generate(convs, max_new_tokens=4)
    assert server.request_count - before == 1 and all(g.cached for g in again)


def test_server_routes_and_bad_requests(server):
    with urllib.request.urlopen(f"{server.url}/models", timeout=5) as resp:
        assert json.load(resp)["data"][0]["id"] == "tiny-llama"

    def post(body: dict) -> int:
        req = urllib.request.Request(
            f"{server.url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                payload = json.load(resp)
                assert payload["object"] == "chat.completion" and payload["usage"]["total_tokens"] > 0
                return resp.status
        except urllib.error.HTTPError as e:
            assert "error" in json.load(e)
            return e.code

    ok = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}
    assert post(ok) == 200
    assert post({**ok, "stream": True}) == 400
    assert post({**ok, "n": 2}) == 400
    assert post({"messages": "hi"}) == 400
    assert post({**ok, "temperature": -1}) == 400


def test_structured_outputs_send_the_names_as_a_regex(tiny_backend):
    from kglightning.llm.backends.base import GenerationParams
    from kglightning.llm.trie.names import NameChoice

    seen: list[dict] = []

    class Recording(ChatCompletionServer):
        def handle_chat(self, body, client_gone=None):
            seen.append(body)
            return super().handle_chat(body, client_gone)

    choice = NameChoice(("Paris", "St. Louis"), max_answers=2)
    conv = [[{"role": "user", "content": "capital of France?"}]]
    with Recording(tiny_backend, port=0, model_name="tiny-llama") as srv:
        for mode in ("vllm", "vllm-legacy"):
            gens = client(srv.url, structured_outputs=mode).generate_with_params(conv, GenerationParams(max_new_tokens=4),
                                                                                [choice])  # fmt: skip
            assert len(gens) == 1
        with pytest.raises(NotImplementedError, match="cannot constrain"):
            client(srv.url).generate_with_params(conv, GenerationParams(max_new_tokens=4), [choice])
    assert seen[0]["structured_outputs"] == {"regex": choice.regex()} and "guided_regex" not in seen[0]
    assert seen[1]["guided_regex"] == choice.regex() and "structured_outputs" not in seen[1]
    with pytest.raises(ValueError, match="structured_outputs"):
        client("http://127.0.0.1:9/v1", structured_outputs="sglang")
