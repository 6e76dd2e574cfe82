"""Text encoding on 1 and more CPU processes (``SentenceEncoder(num_proc=N)``), side by side in one run: seconds,
strings per second, speed-up, and how far the vectors are from one process's.

The strings are node and relation names of the embedded benchmark's kind (seeded), encoded by the bundled
all-MiniLM-L6-v2 (or ``--model``). With ``num_proc > 1`` the call is a ``datasets`` map over the strings on that
many forked processes of one torch thread each; one process uses ``--threads`` torch threads.

    python tools/bench/bench_encode_procs.py --strings 20000 --num-proc 1 2
"""

from __future__ import annotations

import argparse
import json
import random
import time


def main() -> None:
    import torch

    from kglightning.data.encoder import BUNDLED_MINILM, SentenceEncoder

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--strings", type=int, default=20000)
    p.add_argument("--num-proc", type=int, nargs="+", default=[1, 2])
    p.add_argument("--model", default=BUNDLED_MINILM)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--threads", type=int, default=2, help="torch threads of the one-process run")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    rng = random.Random(0)
    words = ["river", "capital", "population", "language", "border", "mountain", "currency", "element", "album"]
    texts = [f"{rng.choice(words)} {rng.choice(words)} {i} {'of the ' * rng.randrange(4)}{rng.choice(words)}"
             for i in range(args.strings)]  # fmt: skip
    rows, reference = [], None
    for n in args.num_proc:
        encoder = SentenceEncoder(args.model, batch_size=args.batch_size, show_progress=False, num_proc=n)
        encoder.encode(texts[:8])  # load the model outside the timing
        t0 = time.perf_counter()
        vectors = encoder.encode(texts)
        seconds = time.perf_counter() - t0
        reference = vectors if reference is None else reference
        same16 = (vectors.half() == reference.half()).all(dim=1).float().mean().item()
        rows.append({"num_proc": n, "seconds": round(seconds, 1), "strings_per_s": round(len(texts) / seconds),
                     "speedup": round(rows[0]["seconds"] / seconds, 2) if rows else 1.0,
                     "max_abs_diff": float((vectors - reference).abs().max()), "rows_equal_in_float16": round(same16, 4)})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    print("\n| processes | seconds | strings/s | speed-up | max abs diff | rows equal in float16 |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['num_proc']} | {r['seconds']} | {r['strings_per_s']:,} | {r['speedup']:.2f}x | "
              f"{r['max_abs_diff']:.1e} | {r['rows_equal_in_float16']:.2%} |")  # fmt: skip


if __name__ == "__main__":
    main()
