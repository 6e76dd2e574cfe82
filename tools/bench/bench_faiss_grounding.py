"""faiss grounding throughput against a brute-force cosine search, side by side in one run.

What :class:`~kglightning.retrieval.FaissGrounder` does per lookup: the nearest of ``--names`` unit vectors (dim 384,
MiniLM's) to each of ``--queries`` answer vectors. Timed on the same vectors (random unit vectors, seeded: search cost
does not depend on what the vectors mean): faiss ``IndexFlatIP`` (exact; the build, then the search) and a torch
``queries @ names.T`` + argmax in chunks of ``--chunk`` queries (the brute force one writes without faiss). Results are
asserted equal. On a GPU with faiss-gpu, both run there too. Best of ``--repeat``, ``torch.set_num_threads(--threads)``
and ``faiss.omp_set_num_threads(--threads)``.

    PYTHONPATH=. python tools/bench/bench_faiss_grounding.py [--names 20000 200000] [--queries 2000]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch


def _best(fn, repeat: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def run(n_names: int, n_queries: int, dim: int, chunk: int, repeat: int, device: str) -> dict[str, float]:
    import faiss

    rng = np.random.default_rng(0)
    names = rng.standard_normal((n_names, dim)).astype(np.float32)
    names /= np.linalg.norm(names, axis=1, keepdims=True)
    queries = names[rng.integers(0, n_names, n_queries)] + 0.05 * rng.standard_normal((n_queries, dim)).astype(
        np.float32
    )
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)

    def build():
        index = faiss.IndexFlatIP(dim)
        if device == "cuda":
            index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)
        index.add(names)
        return index

    build_s, index = _best(build, repeat)
    faiss_s, (sims, ids) = _best(lambda: index.search(queries, 1), repeat)
    t_names, t_queries = torch.from_numpy(names).to(device), torch.from_numpy(queries).to(device)

    def brute():
        out = []
        for start in range(0, n_queries, chunk):
            out.append((t_queries[start : start + chunk] @ t_names.T).argmax(dim=1))
        result = torch.cat(out)
        if device == "cuda":
            torch.cuda.synchronize()
        return result

    torch_s, best = _best(brute, repeat)
    agree = float((best.cpu().numpy() == ids[:, 0]).mean())
    assert agree > 0.999, f"faiss and brute force disagree on {1 - agree:.2%} of the queries"
    return {"build_s": build_s, "faiss_qps": n_queries / faiss_s, "torch_qps": n_queries / torch_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--names", type=int, nargs="+", default=[20000, 200000])
    p.add_argument("--queries", type=int, default=2000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--chunk", type=int, default=256)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    import faiss

    torch.set_num_threads(args.threads)
    faiss.omp_set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and hasattr(faiss, "StandardGpuResources") else [])
    print(f"faiss {faiss.__version__}, torch {torch.__version__}, {platform.processor() or platform.machine()}, "
          f"{args.threads} threads, {args.queries} queries, dim {args.dim}")  # fmt: skip
    print("| device | names | faiss build s | faiss queries/s | brute-force queries/s | faiss / brute force |")
    print("|---|---:|---:|---:|---:|---:|")
    for device in devices:
        for n in args.names:
            r = run(n, args.queries, args.dim, args.chunk, args.repeat, device)
            print(f"| {device} | {n} | {r['build_s']:.3f} | {r['faiss_qps']:.0f} | {r['torch_qps']:.0f} | "
                  f"{r['faiss_qps'] / r['torch_qps']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
