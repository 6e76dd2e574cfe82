"""Load and soak figures of ``kglightning serve`` (issue 60): the real server in a subprocess, called over HTTP.

The questions are the embedded benchmark's test split with the main job's proposed answers (its graphs: a median of
about 200 triples), read through the detector's own data module. For each setting (``--max_batch_size 1`` and 16 on
one worker, 16 on two ``--workers``) the server is started, warmed up, and sent every question ``--rounds`` times at
concurrency 1, 8 and 32 (one asyncio client, a connection per concurrent request): requests per second, p50 and p99
latency. Beside it, in the same run, the same questions scored in-process
(:class:`~kglightning.serve.guard.GuardScorer`, batches of 16: the server's work without HTTP), Lightning's
``predict`` over the same questions (``predict_questions.py``: the baseline issue 60 names), and the p50 latency of a
small question (its first 20 triples, 5 answers) at concurrency 1.

``--large N`` sends ``N`` questions with graphs of GNN-RAG's size (about 4,150 triples, from
``rog_generator.py``; their texts encoded into the cache first) to the batching server on one and on two workers,
beside in-process scoring of the same. ``--soak-minutes M`` runs the batching server at concurrency 32 for M minutes,
one request in 100 malformed (a rotating set of bad bodies), and records every status code, whether each malformed
request got a 4xx, and the resident memory of the server's processes each minute.

    python tools/bench/bench_serve.py --soak-minutes 10 --large 0 --output docs/results/serve_load.json
    python tools/bench/bench_serve.py --large-only --output docs/results/serve_large.json
    python tools/bench/bench_serve.py --large 0 --rounds 1     # a quick look, printed only

Needs the main job's checkpoint (``fit --config configs/detector.yaml``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT / "tools" / "bench"))
sys.path.insert(0, str(ROOT))

from record_run import _commit, machine  # noqa: E402
from side_by_side import write_result  # noqa: E402

from kglightning.serve.schema import LIMITS  # noqa: E402
from kglightning.testing.server import ServerProcess  # noqa: E402

JSON = {"content-type": "application/json"}
CHECKPOINT = "outputs/detector/graph_transformer/checkpoints/best.ckpt"
BAD_BODIES = [
    {"question": "q", "answers": [], "graph": [["a", "r", "b"]]},
    {"question": "q", "answers": [7], "graph": [["a", "r", "b"]]},
    {"answers": ["a"], "graph": [["a", "r", "b"]]},
    {"question": "q", "answers": ["a"], "graph": [["a", "r"]]},
    {"question": "q", "answers": ["a"], "graph": "a r b"},
    {"question": "q", "answers": ["a"], "graph": [["a", "r", "b"]], "confidence": [2.0]},
]


def _bodies(checkpoint: str) -> tuple[list[dict], object]:
    """The test questions as request bodies, and the in-process scorer (the served weights)."""
    from kglightning.cli.serve import build_scorer

    scorer = build_scorer([str(ROOT / "configs/detector.yaml")], [], checkpoint)
    records = [r for r in scorer.data.records("test") if r.prediction]
    bodies = [{"id": r.id, "question": r.question, "answers": list(r.prediction), "graph": [list(t) for t in r.graph],
               "topic_entities": list(r.q_entity)} for r in records]  # fmt: skip
    return bodies, scorer


def _in_process(scorer: object, bodies: list[dict], batch: int = 16) -> dict[str, float]:
    from kglightning.serve.schema import GuardRequest

    records = [GuardRequest(**b).record() for b in bodies]
    scorer.score(records[:batch])  # warm
    start, cpu = time.perf_counter(), time.process_time()
    for lo in range(0, len(records), batch):
        scorer.score(records[lo : lo + batch])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"questions": len(records), "seconds": round(seconds, 2), "per_second": round(len(records) / seconds, 1),
            "cpu_ms_per_question": round(1000 * cpu / len(records), 2)}  # fmt: skip


def _predict(scorer: object, bodies: list[dict], checkpoint: str) -> dict[str, float]:
    """Lightning's ``predict`` over the same questions, in a process of its own (``predict_questions.py``): the
    records written as a test split, read and their graphs built anew, the texts' encodings from this cache."""
    from kglightning.data.store.cache import default_cache_root

    wanted = {b["id"] for b in bodies}
    rows = [json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in scorer.data.records("test") if r.id in wanted]
    with tempfile.TemporaryDirectory(prefix="bench-serve-predict-") as tmp:
        (Path(tmp) / "test.jsonl").write_text("".join(rows), encoding="utf-8")
        for split in ("train", "validation"):  # a records folder has all three; predict reads the test split
            (Path(tmp) / f"{split}.jsonl").write_text(rows[0], encoding="utf-8")
        done = subprocess.run([sys.executable, str(ROOT / "tools/bench/predict_questions.py"), "--records", tmp,
                               "--checkpoint", checkpoint, "--warm-cache", str(default_cache_root())],
                              capture_output=True, text=True, check=False)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"predict_questions.py failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _server(checkpoint: str, batch: int, workers: int, log: Path, *extra: str) -> ServerProcess:
    args = ["--config", "configs/serve.yaml", "--checkpoint", checkpoint, "--max_batch_size", str(batch),
            "--accelerator", "cpu", "--workers", str(workers), *extra]  # fmt: skip
    return ServerProcess(args, ROOT, log)


def _session(concurrency: int) -> aiohttp.ClientSession:
    """The load generator's client: a connection per concurrent request, two minutes per request at most."""
    limits = aiohttp.TCPConnector(limit=concurrency)
    return aiohttp.ClientSession(connector=limits, timeout=aiohttp.ClientTimeout(total=120))


def _load(url: str, bodies: list[dict], concurrency: int, server: ServerProcess | None = None) -> dict[str, object]:
    """Every body sent once by ``concurrency`` clients, each sending its next as soon as its last is answered (one
    asyncio client: about 0.05 of a core at concurrency 32, where a thread per client took a sizeable share of the
    2 cores the server runs on). With ``server``, also the CPU milliseconds a request cost its worker processes,
    its other processes (HTTP servers, queue manager) and the client (this process)."""
    latencies: list[float] = []
    payloads = iter([json.dumps(b).encode() for b in bodies])

    async def client(session: aiohttp.ClientSession) -> list[int]:
        statuses = []
        for body in payloads:
            t = time.perf_counter()
            async with session.post(f"{url}/v1/guard", data=body, headers=JSON) as response:
                await response.read()
                statuses.append(response.status)
            latencies.append(time.perf_counter() - t)
        return statuses

    async def run() -> list[int]:
        async with _session(concurrency) as session:
            done = await asyncio.gather(*[client(session) for _ in range(concurrency)])
        return [s for statuses in done for s in statuses]

    before = server.cpu_seconds() if server is not None else None
    start, client_cpu = time.perf_counter(), time.process_time()  # the bodies encoded already
    statuses = asyncio.run(run())
    seconds, client_cpu = time.perf_counter() - start, time.process_time() - client_cpu
    if any(s != 200 for s in statuses):
        raise SystemExit(f"not every request got a 200: {sorted(set(statuses))}")
    latencies.sort()
    row: dict[str, object] = {"concurrency": concurrency, "requests": len(bodies),
                              "per_second": round(len(bodies) / seconds, 1),
                              "p50_ms": round(1000 * latencies[len(latencies) // 2], 1),
                              "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1)}  # fmt: skip
    if server is not None:
        after = server.cpu_seconds()
        used = {**{k: after[k] - before[k] for k in after}, "client": client_cpu}
        row["cpu_ms_per_request"] = {k: round(1000 * v / len(bodies), 2) for k, v in used.items()}
    return row


def _large(scorer: object, n: int, triples: int = 4150) -> list[dict]:
    """``n`` questions with graphs of GNN-RAG's size (RoG's WebQSP subgraphs, which GNN-RAG answers over: 6.76M
    triples over 1,628 test questions, about 4,150 each, heavy-tailed) from the seeded generator, their texts encoded
    into the cache first, as a server on the data it was trained on finds them."""
    from rog_generator import RoGGenerator

    from kglightning.data.records import KGQARecord

    rows = list(RoGGenerator(seed=0, triples=triples).records(n, "test"))
    records = [KGQARecord.from_dict(r, source="rog_generator") for r in rows]
    scorer.data.embeddings.embed(scorer.data.request_texts(records))
    return [{"id": r["id"], "question": r["question"], "answers": list(r["prediction"]), "graph": r["graph"],
             "topic_entities": list(r["q_entity"])} for r in rows]  # fmt: skip


def _small(bodies: list[dict], n: int = 60) -> list[dict]:
    """Small questions: each body's first 20 triples and 5 answers (4 nodes of those triples and one name that is
    in no graph)."""
    out = []
    for b in bodies[:n]:
        graph = b["graph"][:20]
        nodes = list(dict.fromkeys(x for t in graph for x in (t[0], t[2])))
        out.append({**b, "graph": graph, "answers": nodes[:4] + ["Atlantis of the Nowhere"]})
    return out


def _soak(server: ServerProcess, bodies: list[dict], minutes: float, concurrency: int = 32) -> dict[str, object]:
    statuses: dict[str, int] = {}
    bad_answers: dict[str, int] = {}
    rss: list[float] = [server.rss_mb()]
    stop = time.monotonic() + 60 * minutes
    counter = iter(range(10**9))
    good = [json.dumps(b).encode() for b in bodies]
    bad_bodies = [json.dumps(b).encode() for b in BAD_BODIES]

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop:
            i = next(counter)
            bad = i % 100 == 99
            body = bad_bodies[(i // 100) % len(bad_bodies)] if bad else good[i % len(good)]
            async with session.post(f"{server.url}/v1/guard", data=body, headers=JSON) as response:
                await response.read()
                code = str(response.status)
            statuses[code] = statuses.get(code, 0) + 1
            if bad:
                bad_answers[code] = bad_answers.get(code, 0) + 1

    async def memory() -> None:
        while time.monotonic() < stop:
            await asyncio.sleep(min(60.0, max(0.1, stop - time.monotonic() + 0.1)))
            rss.append(server.rss_mb())

    async def run() -> None:
        async with _session(concurrency) as session:
            await asyncio.gather(memory(), *[client(session) for _ in range(concurrency)])

    asyncio.run(run())
    first = rss[1] if len(rss) > 2 else rss[0]
    return {"minutes": minutes, "concurrency": concurrency, "statuses": statuses, "malformed_statuses": bad_answers,
            "server_errors": sum(n for c, n in statuses.items() if c.startswith("5")),
            "rss_mb_per_minute": rss, "rss_growth": round(rss[-1] / first - 1, 4)}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=CHECKPOINT)
    p.add_argument("--questions", type=int, default=320, help="test questions sent at each concurrency")
    p.add_argument("--rounds", type=int, default=3, help="times each question is sent at each concurrency")
    p.add_argument("--large", type=int, default=32,
                   help="then this many GNN-RAG-size questions (about 4,150 triples each; 0: none)")  # fmt: skip
    p.add_argument("--large-only", action="store_true",
                   help="only the GNN-RAG-size questions (their own result file: docs/results/serve_large.json)")  # fmt: skip
    p.add_argument("--soak-minutes", type=float, default=0.0, help="then a soak of this many minutes (0: none)")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    checkpoint = str((ROOT / args.checkpoint) if not Path(args.checkpoint).is_absolute() else args.checkpoint)
    bodies, scorer = _bodies(checkpoint)
    bodies = bodies[: args.questions]
    result: dict[str, object] = {"date": date.today().isoformat(), "commit": _commit(), "machine": machine(),
                                 "questions": len(bodies),
                                 "median_triples": statistics.median(len(b["graph"]) for b in bodies),
                                 "in_process": _in_process(scorer, bodies)}  # fmt: skip
    result["predict"] = _predict(scorer, bodies, checkpoint)
    large = _large(scorer, args.large) if args.large else []
    if large:  # this process validates the in-process requests too: their graphs are over the default cap
        LIMITS.max_triples = max(len(b["graph"]) for b in large)
    if large:
        result["large"] = {"questions": len(large), "median_triples": statistics.median(len(b["graph"]) for b in large),
                           "max_triples": max(len(b["graph"]) for b in large),
                           "in_process": _in_process(scorer, large)}  # fmt: skip
    del scorer
    print(json.dumps(result["in_process"]), json.dumps(result["predict"]), flush=True)
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    runs = []
    sent = bodies * args.rounds
    for batch, workers in ((1, 1), (16, 1), (16, 2)) if not args.large_only else ():
        server = _server(checkpoint, batch, workers, logs / f"bench_serve_{batch}_{workers}.log")
        try:
            _load(server.url, bodies[:64], 8)  # warm-up
            row = {"max_batch_size": batch, "workers": workers, "ready_seconds": server.ready_seconds,
                   "rss_mb": server.rss_mb(),
                   "load": [_load(server.url, sent, c, server) for c in (1, 8, 32)]}  # fmt: skip
            if (batch, workers) == (16, 1):
                row["small_question"] = _load(server.url, _small(bodies), 1)
                if args.soak_minutes > 0:
                    row["soak"] = _soak(server, bodies, args.soak_minutes)
            runs.append(row)
            print(json.dumps(row), flush=True)
        finally:
            server.stop()
    result["servers"] = runs
    if large:  # the GNN-RAG-size graphs on the batching server (a graph's cap raised to the largest of them)
        cap = str(max(len(b["graph"]) for b in large))
        for workers in (1, 2):
            server = _server(checkpoint, 16, workers, logs / f"bench_serve_large_{workers}.log", "--max_triples", cap)
            try:
                _load(server.url, large[:8], 8)  # warm-up
                row = {"max_batch_size": 16, "workers": workers, "rss_mb": server.rss_mb(),
                       "load": [_load(server.url, large * args.rounds, c) for c in (1, 8, 32)]}  # fmt: skip
                result["large"].setdefault("servers", []).append(row)
                print(json.dumps(row), flush=True)
            finally:
                server.stop()
    write_result(args.output, result)


if __name__ == "__main__":
    main()
