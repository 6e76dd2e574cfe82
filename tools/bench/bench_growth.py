"""How three components grow with their input, side by side with an older checkout: the embedding cache over many
``add`` calls, CLM's calibration over questions, and the GRPO DataModule's KG-Tries over questions.

Each (code, component, size) runs in a fresh process; *peak RSS* is its ``VmHWM``.

* ``embed``: ``EmbeddingCache.add`` called ``n`` times with 256 new strings each (a chunked run over a split);
  the older cache concatenated its whole table and wrote a shard on every call.
* ``clm``: ``CLM.fit`` on ``n`` calibration and ``n`` selection questions of 20 sampled answers each, with a token-F1
  similarity; *calls* counts the similarity calls (the older code computed them once per grid configuration).
* ``grpo``: ``ProxyGRPODataModule(trie=TrieConfig(max_hops=2), trie_cache=16)`` on ``n`` generated questions of 200
  triples: ``setup("fit")``, then one pass over the training batches; the older module built every question's trie
  in ``setup`` and kept them all (it has no ``trie_cache``).

Usage::

    git worktree add /tmp/base 0dad4e5
    PYTHONPATH=. python tools/bench/bench_growth.py --baseline /tmp/base --sizes 100 200 400 800
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
COMPONENTS = ("embed", "clm", "grpo")
TRIE_CACHE = 16  # tries the current GRPO DataModule keeps (its default is 256), so that n passes it


def _peak_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    """Start ``VmHWM`` again from the current RSS (Linux), so that the peak is the measured part's."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _token_f1(a: str, b: str) -> float:
    x, y = a.lower().split(), b.lower().split()
    common = sum(min(x.count(t), y.count(t)) for t in set(x))
    return 0.0 if not common else 2 * common / (len(x) + len(y))


def run_embed(n: int, work: Path) -> dict:
    from bench_scale import HashEncoder

    from kglightning.data.embeddings import EmbeddingCache

    cache = EmbeddingCache(HashEncoder(), work / "cache")
    t0 = time.perf_counter()
    for k in range(n):
        cache.add([f"string {k}-{i}" for i in range(256)])
    return {"seconds": time.perf_counter() - t0, "items": n * 256}


def run_clm(n: int, work: Path) -> dict:
    import random

    from kglightning.conformal.clm import CLM
    from kglightning.conformal.sampling import SampledAnswers

    rng = random.Random(0)
    names = [f"entity {w} {v}" for w in ("north", "south", "east", "west") for v in range(12)]

    def question(i: int) -> SampledAnswers:
        pool = rng.sample(names, 6)
        samples = tuple(rng.choice(pool) for _ in range(20))
        return SampledAnswers(samples, gold=frozenset(rng.sample(pool, 1)), id=f"q{i}")

    cal, sel = [question(i) for i in range(n)], [question(n + i) for i in range(n)]
    calls = [0]

    def similarity(a: str, b: str) -> float:
        calls[0] += 1
        return _token_f1(a, b)

    t0 = time.perf_counter()
    CLM(similarity=similarity).fit(cal, sel, alpha=0.2)
    return {"seconds": time.perf_counter() - t0, "items": 2 * n, "calls": calls[0]}


def run_grpo(n: int, work: Path) -> dict:
    from rog_generator import RoGGenerator, write

    from kglightning.datamodules.grpo import ProxyGRPODataModule
    from kglightning.llm.trie import TrieConfig

    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    write(RoGGenerator(seed=0, triples=200), n, "train", data / "train.jsonl")
    for seed, split in ((1, "validation"), (2, "test")):
        write(RoGGenerator(seed=seed, triples=200), 8, split, data / f"{split}.jsonl")
    miner = ProxyGRPODataModule(data_dir=str(data), cache_dir=str(work / "kgl-cache"), trie=None, batch_size=8)
    miner.prepare_data()
    miner.setup("fit")  # mines the evidence (cached) once, outside the timer, without tries
    del miner
    gc.collect()
    _reset_peak()
    bounded = "trie_cache" in inspect.signature(ProxyGRPODataModule.__init__).parameters  # older code: no bound
    dm = ProxyGRPODataModule(
        data_dir=str(data), cache_dir=str(work / "kgl-cache"), trie=TrieConfig(max_hops=2), batch_size=8,
        **({"trie_cache": TRIE_CACHE} if bounded else {}),
    )  # fmt: skip
    t0 = time.perf_counter()
    dm.setup("fit")
    setup_s, setup_peak = time.perf_counter() - t0, _peak_mib()
    batches = sum(1 for _ in dm.train_dataloader())
    return {"seconds": time.perf_counter() - t0, "items": n, "setup_s": setup_s, "setup_peak_mib": setup_peak,
            "batches": batches}  # fmt: skip


def child(component: str, n: int) -> dict:
    os.environ.setdefault("KGLIGHTNING_CACHE", tempfile.mkdtemp(prefix="kgl-growth-"))
    with tempfile.TemporaryDirectory(prefix="kgl-growth-") as tmp:
        out = {"embed": run_embed, "clm": run_clm, "grpo": run_grpo}[component](n, Path(tmp))
    return {"component": component, "n": n, **out, "peak_rss_mib": round(_peak_mib(), 1)}


def spawn(impl: str, src: Path, component: str, n: int) -> dict:
    path = os.pathsep.join(p for p in (str(src), str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS=os.environ.get("BENCH_THREADS", "1"))
    cmd = [sys.executable, str(Path(__file__)), "--child", component, "--n", str(n)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=src)
    if out.returncode != 0:
        return {"impl": impl, "component": component, "n": n, "error": out.stderr.strip().splitlines()[-1:]}
    return {"impl": impl, **json.loads(out.stdout.strip().splitlines()[-1])}


def slope(rows: list[dict]) -> float:
    """Least-squares slope of log(seconds) against log(n): 1 is linear growth, 2 quadratic."""
    pts = [(math.log(r["n"]), math.log(r["seconds"])) for r in rows if "seconds" in r and r["seconds"] > 0]
    if len(pts) < 2:
        return float("nan")
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def table(rows: list[dict]) -> str:
    lines = ["| component | code | n | seconds | per item ms | peak RSS MiB | similarity calls | setup s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['component']} | {r['impl']} | {r['n']} | error: {' '.join(r['error'])[:80]} |||||")
            continue
        lines.append(
            f"| {r['component']} | {r['impl']} | {r['n']} | {r['seconds']:.2f} | {1000 * r['seconds'] / r['items']:.3f}"
            f" | {r['peak_rss_mib']:.0f} | {r.get('calls', '')} | "
            f"{'' if r.get('setup_s') is None else format(r['setup_s'], '.2f')} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--components", nargs="+", default=list(COMPONENTS), choices=COMPONENTS)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 200, 400, 800])
    p.add_argument("--baseline", type=Path, help="a checkout of the code to compare with")
    p.add_argument("--output", type=Path, help="write the rows as JSON here")
    p.add_argument("--child", choices=COMPONENTS, help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n)))
        return
    impls = [("current", ROOT)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    rows = []
    for component in args.components:
        for n in args.sizes:
            for impl, src in impls:
                rows.append(spawn(impl, src, component, n))
                print(json.dumps(rows[-1]), flush=True)
    print()
    print(table(rows))
    print()
    for component in args.components:
        for impl, _ in impls:
            mine = [r for r in rows if r["component"] == component and r["impl"] == impl]
            print(f"{component} {impl}: slope of seconds against n {slope(mine):.2f}")
    if args.output:
        args.output.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
