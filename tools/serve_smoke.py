"""CI's check of ``kglightning serve`` on the embedded benchmark: fit a small detector on it (300 questions a split,
one epoch: minutes, not the main job's quarter hour), start the real server on that checkpoint with the embedded KG,
and call it: test questions get their verdicts, with their graph and without it (the server cuts it from the KG), a
malformed request its 422, and the server stops when told.

    python tools/serve_smoke.py            # in a temporary folder; exit 1 with the server's log on a failure

The fit's outputs go to a temporary folder; the embedded benchmark and the text encodings go to the kglightning
cache (``KGLIGHTNING_CACHE``) as the main job's do.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kglightning.testing.server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--data.init_args.max_records", "300", "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false"]


def _run(cwd: Path, *args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "kglightning", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"kglightning {args[0]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")


def main() -> int:
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        config = str(ROOT / "configs/detector.yaml")
        _run(work, "fit", "--config", config, *SMALL, "--test_after_fit", "false")
        checkpoint = work / "outputs/detector/graph_transformer/checkpoints/best.ckpt"
        print(f"fitted in {time.monotonic() - start:.0f} s", flush=True)
        args = ["--config", str(ROOT / "configs/serve.yaml"), "--detector_config", config, "--checkpoint",
                str(checkpoint), "--data.init_args.max_records", "300", "--kg", "embedded"]  # fmt: skip
        try:
            server = ServerProcess(args, work, work / "server.log", timeout=600)
        except RuntimeError as err:
            raise SystemExit(str(err)) from None
        url = server.url
        try:
            records = _test_records(work)
            for record in records:
                body = {"id": record["id"], "question": record["question"], "answers": record["answer"] + ["Atlantis"],
                        "graph": record["graph"], "topic_entities": record["q_entity"]}  # fmt: skip
                r = httpx.post(f"{url}/v1/guard", json=body, timeout=60)
                if r.status_code != 200 or len(r.json()["answers"]) + len(r.json()["not_scored"]) < 1:
                    raise SystemExit(f"{record['id']}: {r.status_code} {r.text[:1000]}")
                print(json.dumps({a["answer"]: a["hallucination_prob"] for a in r.json()["answers"]}), flush=True)
            body = {"question": records[0]["question"], "answers": records[0]["answer"],
                    "topic_entities": records[0]["q_entity"]}  # fmt: skip
            r = httpx.post(f"{url}/v1/guard", json=body, timeout=60)
            if r.status_code != 200 or not r.json()["retrieved"] or not r.json()["retrieved"]["triples"]:
                raise SystemExit(f"a request without a graph: {r.status_code} {r.text[:1000]}")
            print(f"cut from the KG: {r.json()['retrieved']['triples']} triples", flush=True)
            bad = httpx.post(f"{url}/v1/guard", json={"question": "q", "answers": [3], "graph": []}, timeout=60)
            if bad.status_code != 422:
                raise SystemExit(f"a malformed request got {bad.status_code}, not 422: {bad.text[:500]}")
        finally:
            alive = server.stop()
        if alive:
            raise SystemExit(f"processes left running after SIGTERM: {alive}")
    print(f"serve smoke: ok in {time.monotonic() - start:.0f} s")
    return 0


def _test_records(work: Path, n: int = 3) -> list[dict]:
    """The first test questions of the embedded benchmark the fit used (from the cache's copy)."""
    from kglightning.data.store.cache import default_cache_root

    found = sorted(default_cache_root().glob("embedded-*/test.jsonl"))
    if not found:
        raise SystemExit(f"no embedded benchmark under {default_cache_root()} after the fit")
    with found[0].open() as f:
        return [json.loads(next(f)) for _ in range(n)]


if __name__ == "__main__":
    raise SystemExit(main())
