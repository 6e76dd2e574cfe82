"""What the server checks before and around a request, in-process: the deadline middleware, the KG cut's settings,
the serve options, and the schema with and without a server KG."""

from __future__ import annotations

import asyncio
import math
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from kglightning.cli.serve import main as serve_main
from kglightning.data.kg import KGIndex
from kglightning.serve.api import Deadline
from kglightning.serve.kg import ServedKG
from kglightning.serve.schema import LIMITS, GuardRequest

DETECTOR = Path(__file__).resolve().parents[2] / "configs/detector.yaml"


def _call(middleware: Deadline, path: str = "/v1/guard") -> list[dict]:
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.get_event_loop().run_until_complete(middleware({"type": "http", "path": path}, receive, send))
    return sent


def test_a_late_request_gets_a_504_and_finishes_in_the_background():
    """The app behind the deadline answers after 0.3 s: the caller gets a 504 at 0.05 s, the app still runs to its
    end (so LitServe drops its record of the request), and its late answer is not sent."""
    finished = []

    async def slow(scope, receive, send):
        await asyncio.sleep(0.3)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"late"})
        finished.append(True)

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        deadline = Deadline(slow, timeout=0.05)
        sent = _call(deadline)
        assert sent[0]["status"] == 504 and b"timeout" in sent[1]["body"] and len(sent) == 2
        assert deadline._late and not finished
        loop.run_until_complete(asyncio.sleep(0.5))
        assert finished == [True] and not deadline._late and len(sent) == 2
    finally:
        loop.close()


def test_a_closing_server_refuses_new_requests_and_fails_its_health_check():
    class Closing:
        def is_set(self) -> bool:
            return True

    async def app(scope, receive, send):  # never reached
        raise AssertionError("a request reached the app while closing")

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        deadline = Deadline(app, timeout=5, closing=Closing())
        assert _call(deadline)[0]["status"] == 503
        assert _call(deadline, "/health")[0]["status"] == 503
    finally:
        loop.close()


@pytest.mark.parametrize(
    "settings",
    [{"hops": 1.5}, {"topk": 2.5}, {"max_nodes": -3}, {"cost_e": math.nan}, {"hops": 0}, {"hops": True}, {"colour": 1}],
)
def test_bad_kg_retrieval_settings_are_refused_before_serving(settings: dict):
    kg = KGIndex.from_triples([("a", "r", "b")])
    with pytest.raises(ValueError, match="kg_retrieval"):
        ServedKG(kg, settings)


@pytest.mark.parametrize("option", ["--timeout", "--batch_timeout", "--selection_alpha"])
def test_a_nan_option_is_refused(option: str, capsys):
    with pytest.raises(SystemExit) as stop:
        serve_main([option, "nan"])
    assert stop.value.code == 2 and "NaN" in capsys.readouterr().err


def test_a_bad_kg_retrieval_option_is_named_once(tmp_path, capsys):
    zipfile.ZipFile(tmp_path / "a.ckpt", "w").close()  # only its form is read before the settings are checked
    with pytest.raises(SystemExit) as stop:
        serve_main(["--detector_config", str(DETECTOR), "--checkpoint", str(tmp_path / "a.ckpt"), "--kg", "embedded",
                    "--kg_retrieval", "{hops: 0}"])  # fmt: skip
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "error: --kg_retrieval: hops must be a whole number >= 1, got 0" in err, err


def test_a_file_that_is_no_checkpoint_is_refused_before_any_worker_starts(tmp_path, capsys):
    (tmp_path / "notes.ckpt").write_text("not a checkpoint")
    with pytest.raises(SystemExit) as stop:
        serve_main(["--detector_config", str(DETECTOR), "--checkpoint", str(tmp_path / "notes.ckpt")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "notes.ckpt: not a checkpoint (torch.save writes a zip archive)" in err, err


@pytest.fixture
def kg_nodes():
    """The schema checked as a server with a KG of three nodes checks it (and without one after)."""
    LIMITS.kg_nodes = {"Paris", "France", "Europe"}
    yield
    LIMITS.kg_nodes = None


def test_without_a_server_kg_a_request_needs_its_graph():
    with pytest.raises(ValidationError) as err:
        GuardRequest(question="q", answers=["a"], topic_entities=["Paris"])
    assert err.value.errors()[0]["loc"] == ("graph",) and "no KG" in str(err.value)


def test_with_a_server_kg_a_request_without_a_graph_needs_a_topic_entity_in_it(kg_nodes):
    ok = GuardRequest(question="q", answers=["a"], topic_entities=["Atlantis", "Paris"])
    assert ok.graph is None and ok.record().graph == []
    for topics in ({}, {"topic_entities": []}, {"topic_entities": ["Atlantis"]}):
        with pytest.raises(ValidationError) as err:
            GuardRequest(question="q", answers=["a"], **topics)
        assert err.value.errors()[0]["loc"] == ("topic_entities",), err.value
    # a request that sends its graph needs no topic entity in the KG
    assert GuardRequest(question="q", answers=["a"], graph=[["x", "r", "y"]]).topic_entities == []
