"""The guard on LitServe: :class:`GuardAPI` (a ``litserve.LitAPI``) and :func:`guard_server`.

Requests are validated by FastAPI against :class:`~kglightning.serve.schema.GuardRequest` in the API server process,
before they are queued, so a malformed request gets its 4xx and never reaches (or fails) a batch. LitServe gathers
the valid ones into batches of up to ``max_batch_size`` (waiting at most ``batch_timeout``); a worker builds their
graphs and scores them with one forward pass (:class:`~kglightning.serve.guard.GuardScorer`). A request with no
response ``timeout`` seconds after it arrived gets a 504 (:class:`Deadline`). With a calibration, ``POST
/v1/guard/batch`` (:class:`GuardBatchAPI`) keeps answers by a rule over a batch of questions.

The API key: when the environment variable named by ``api_key_env`` (``KGLIGHTNING_API_KEY``) is set when the server
starts, every request but ``GET /health`` must carry it in ``X-API-Key`` (401 otherwise); it is compared in constant
time and never logged.
"""

import asyncio
import hmac
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

import litserve as ls
from fastapi import Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from kglightning.serve.guard import GuardScorer, verdicts
from kglightning.serve.schema import GuardBatchRequest, GuardBatchResponse, GuardRequest, GuardResponse
from kglightning.serve.selection import ServedSelection

__all__ = ["Deadline", "GuardAPI", "GuardBatchAPI", "guard_server"]

log = logging.getLogger(__name__)


class GuardAPI(ls.LitAPI):
    """KG-Guard behind ``POST /v1/guard``.

    Args:
        build: makes the :class:`~kglightning.serve.guard.GuardScorer` in each worker (picklable: workers are
            spawned processes), e.g. a ``functools.partial`` of a module-level function.
        api_key: the key requests must carry in ``X-API-Key`` (``None``: no key asked).
        max_batch_size: requests scored together.
        batch_timeout: seconds a batch waits to fill.
        selection: the ``question`` rule, calibrated, that decides ``kept`` (``None``: kept = not flagged).
        api_path: the route it serves.
    """

    def __init__(
        self,
        build: Callable[[], GuardScorer],
        api_key: str | None = None,
        max_batch_size: int = 16,
        batch_timeout: float = 0.005,
        selection: ServedSelection | None = None,
        api_path: str = "/v1/guard",
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path=api_path)
        self.build = build
        self.selection = selection
        self._key = api_key.encode() if api_key else None
        self.scorer: GuardScorer | None = None

    def setup(self, device: str) -> None:
        scorer = self.build()
        scorer.model.to(device)
        scorer.warm_up()
        self.scorer = scorer
        print(f"{self.api_path}: a worker (pid {os.getpid()}) scores on {device}", file=sys.stderr, flush=True)

    async def authorize(
        self,
        request: Request,
        x_api_key: str | None = Header(None, description="the server's API key, when it has one"),
    ) -> None:
        """The FastAPI dependency of every route but ``/health`` (what a liveness probe calls without a key); a
        coroutine, so that FastAPI runs it on the event loop rather than handing each request to a thread."""
        if request.url.path == "/health":
            return
        if self._key is not None and not hmac.compare_digest((x_api_key or "").encode(), self._key):
            raise HTTPException(status_code=401, detail="a valid X-API-Key header is required")

    def decode_request(self, request: GuardRequest) -> GuardRequest:
        return request

    def batch(self, inputs: list[GuardRequest]) -> list[GuardRequest]:
        return list(inputs)

    def predict(self, x: Any) -> list[dict[str, Any]]:
        requests = x if isinstance(x, list) else [x]
        rows, cuts = self._scored(requests, chunk=len(requests))
        out = self._verdicts(requests, rows, cuts, [None] * len(requests))
        return out if isinstance(x, list) else out[0]

    def _scored(self, requests: Sequence[GuardRequest], chunk: int) -> tuple[list, list]:
        """Each request's detector row (``chunk`` requests a forward pass), and what was cut for it from the KG
        (``None``: it sent its graph)."""
        if self.scorer is None:
            raise RuntimeError(
                f"{type(self).__name__}.predict before setup(): LitServe calls setup in each worker first"
            )
        records, cuts = zip(*(self.scorer.with_graph(r.record(), r.graph is None) for r in requests))
        rows = [row for lo in range(0, len(records), chunk) for row in self.scorer.score(records[lo : lo + chunk])]
        return rows, list(cuts)

    def _verdicts(self, requests: Sequence[GuardRequest], rows: list, cuts: list, kept: list) -> list[dict[str, Any]]:
        """The responses of ``requests`` from their rows; ``kept``: per request, the batch rule's choices and their
        description, or ``None`` (the server's per-request selection)."""
        model = self.scorer.model
        threshold, loose = float(model.threshold), float(model.ungrounded_threshold)
        return [
            verdicts(r.id, r.answers, row, threshold, loose, self.scorer.checkpoint, self.selection, keep, cut)
            for r, row, cut, keep in zip(requests, rows, cuts, kept)
        ]

    def unbatch(self, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return output

    def encode_response(self, output: dict[str, Any]) -> GuardResponse:
        return GuardResponse(**output)


class GuardBatchAPI(GuardAPI):
    """``POST /v1/guard/batch``: questions sent together, scored as ``/v1/guard`` scores them, whose answers are kept
    by a rule over the whole batch (``top``, ``fdr``, ``kept_rate``; or ``question``, as single requests are); served
    when the server has a calibration. A request is already a batch: it is scored on its own, in chunks of
    ``chunk`` questions.

    Args:
        build: as :class:`GuardAPI`'s.
        selection: the calibration the rules select with.
        api_key: as :class:`GuardAPI`'s.
        chunk: questions scored in one forward pass.
    """

    def __init__(
        self,
        build: Callable[[], GuardScorer],
        selection: ServedSelection,
        api_key: str | None = None,
        chunk: int = 16,
    ) -> None:
        super().__init__(build, api_key, max_batch_size=1, batch_timeout=0.0, selection=selection,
                         api_path="/v1/guard/batch")  # fmt: skip
        self.chunk = chunk

    def decode_request(self, request: GuardBatchRequest) -> GuardBatchRequest:
        return request

    def predict(self, x: GuardBatchRequest) -> dict[str, Any]:
        questions = x.questions
        rows, cuts = self._scored(questions, self.chunk)
        ids = [q.id for q in questions]
        distinct = None not in ids and len(set(ids)) == len(ids)  # else their positions key the seeded draws
        kept, described = self.selection.select_batch(rows, x.rule, ids if distinct else None)
        responses = self._verdicts(questions, rows, cuts, [(keep, described) for keep in kept])
        return {"responses": responses, "selection": described}

    def encode_response(self, output: dict[str, Any]) -> GuardBatchResponse:
        return GuardBatchResponse(**output)


def guard_server(
    build: Callable[[], GuardScorer],
    accelerator: str = "auto",
    max_batch_size: int = 16,
    batch_timeout: float = 0.005,
    timeout: float = 30.0,
    max_body_bytes: int = 8_000_000,
    api_key_env: str = "KGLIGHTNING_API_KEY",
    selection: ServedSelection | None = None,
    workers: int = 1,
    closing: Any = None,
) -> ls.LitServer:
    """A ``litserve.LitServer`` serving :class:`GuardAPI` on ``workers`` processes, each with its own copy of the
    detector (``accelerator="auto"``: on a GPU when there is one); its key, when ``api_key_env`` is set, read from
    the environment once. Responses come back to the HTTP processes over ZeroMQ (LitServe's ``fast_queue``, which
    cut a request's time at concurrency 1 by about a third: BENCHMARKS.md, "The guard as a service under load").
    ``closing``: an event (a ``multiprocessing.Event``) that, once set, has new requests refused with a 503 while
    those in flight finish."""
    key = os.environ.get(api_key_env) or None
    log.info(
        "serve: %s", f"an API key is required ({api_key_env} is set)" if key else f"no API key ({api_key_env} unset)"
    )
    apis: list[ls.LitAPI] = [GuardAPI(build, key, max_batch_size, batch_timeout, selection)]
    if selection is not None:  # the batch rules need a calibration; one worker scores the batches
        apis.append(GuardBatchAPI(build, selection, key, chunk=max_batch_size))
    per_api = [workers, 1][: len(apis)]
    server = ls.LitServer(apis, accelerator=accelerator, devices=1, workers_per_device=per_api, timeout=timeout,
                          max_payload_size=max_body_bytes, track_requests=True, fast_queue=True)  # fmt: skip
    server.app.add_exception_handler(RequestValidationError, _invalid)
    server.app.add_middleware(Deadline, timeout=timeout, closing=closing)
    return server


class Deadline:
    """ASGI middleware: a request to an endpoint under ``/v1/`` that has no response ``timeout`` seconds after it
    arrived gets a 504 (LitServe's own timeout answers a request only when a worker takes it from the queue, so one
    behind a long batch would wait for it, however long). The request is left to finish in the background, its
    answer dropped: LitServe keeps a record of each request until the worker answers it, which cancelling it would
    leave behind for good. Once ``closing`` is set (the server is stopping), a new request gets a 503, and so does
    ``GET /health``, so that a load balancer stops sending requests.

    Args:
        app: the ASGI app it wraps.
        timeout: seconds from a request's arrival to its response.
        closing: an event with ``is_set()``, or ``None``.
    """

    def __init__(self, app: Any, timeout: float, closing: Any = None) -> None:
        self.app, self.timeout, self.closing = app, timeout, closing
        self._late: set[asyncio.Future] = set()  # requests answered with a 504, until the worker answers them

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        guarded = path.startswith("/v1/")
        if (guarded or path == "/health") and self.closing is not None and self.closing.is_set():
            await _reply(send, 503, "the server is shutting down")
            return
        if not guarded:
            await self.app(scope, receive, send)
            return
        began = late = False

        async def sending(message: dict) -> None:
            nonlocal began
            if late:  # answered with a 504 already
                return
            began = True  # a response under way is finished, not cut off
            await send(message)

        task = asyncio.ensure_future(self.app(scope, receive, sending))
        done, _ = await asyncio.wait({task}, timeout=self.timeout)
        if task in done or began:
            await task
            return
        late = True
        self._late.add(task)
        task.add_done_callback(self._forget)
        await _reply(send, 504, f"no response within this server's timeout of {self.timeout:g} s")

    def _forget(self, task: asyncio.Future) -> None:
        self._late.discard(task)
        if not task.cancelled() and task.exception() is not None:  # retrieved: no "never retrieved" warning
            log.warning("a request answered with a 504 then failed: %s", task.exception())


async def _reply(send: Callable, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    """A 422 naming each field and what is wrong with it, without echoing the input back (FastAPI's own response
    echoes it, and an input such as NaN or a lone surrogate cannot be written as JSON: that was a 500)."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    detail = [{"type": e.get("type"), "loc": list(e.get("loc", ())), "msg": str(e.get("msg"))} for e in errors]
    return JSONResponse(status_code=422, content={"detail": detail})
