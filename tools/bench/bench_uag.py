"""UAG benchmark: traversal throughput (questions/s) and grid calibration against a per-configuration loop.

On the embedded benchmark (validation = calibration pool, test = traversed questions), with text embeddings
already cached (the first, cold pass that encodes every new string is timed separately; the questions' own step
queries and path texts are stored too, ``store_question_texts=True`` as ``configs/uag.yaml`` sets it), in one run:
  * **traversal**: :class:`UAGTraversal` (Algorithm 1) per test question at the configuration LTT selects for
    ``--alpha``, and with every filter off (``q = +inf``: the whole ``max_hops`` neighbourhood);
  * **scoring**: :func:`score_questions`, every relation path's Eq. 4-6 scores (what calibration needs);
  * **grid**: the sets of all ``(1/h)^3`` configurations on ``--n-grid`` calibration questions: one
    :func:`grid_outcomes` call against a loop of :func:`members_at` per configuration and question (results
    asserted equal).
Times are wall-clock seconds, best of ``--repeat``, with ``torch.set_num_threads(--threads)``.

    PYTHONPATH=. python tools/bench/bench_uag.py [--encoder bundled:all-MiniLM-L6-v2] [--n-test 500]
"""

from __future__ import annotations

import argparse
import math
import platform
import resource
import tempfile
import time
from datetime import date

import torch

from kglightning.conformal.uag import (
    UAGController,
    UAGTraversal,
    covers,
    grid_outcomes,
    members_at,
    score_questions,
)
from kglightning.data.embeddings import EmbeddingCache, SentenceEncoder
from kglightning.data.kg import KGIndex
from kglightning.datamodules import KGQADataModule


def best_time(fn, repeat: int):
    best, out = math.inf, None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encoder", default="bundled:all-MiniLM-L6-v2")
    ap.add_argument("--cache-dir", default=None, help="embedding cache root (default: a temporary folder)")
    ap.add_argument("--n-test", type=int, default=500)
    ap.add_argument("--n-grid", type=int, default=100, help="calibration questions in the grid comparison")
    ap.add_argument("--alpha", type=float, default=0.3)
    ap.add_argument("--grid-step", type=float, default=0.1)
    ap.add_argument("--max-hops", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    data = KGQADataModule()
    pool_records = data.split_records("validation")
    test = data.split_records("test")[: args.n_test]
    root = args.cache_dir or tempfile.mkdtemp(prefix="bench_uag_")
    cache = EmbeddingCache(SentenceEncoder(args.encoder, show_progress=False), root)

    cached = len(cache)
    t0 = time.perf_counter()
    pool = score_questions(pool_records, cache, max_hops=args.max_hops, progress=False, store_question_texts=True)
    score_questions(test, cache, max_hops=args.max_hops, progress=False, store_question_texts=True)
    cold = time.perf_counter() - t0
    ctl = UAGController(grid_step=args.grid_step).fit(pool)
    sel = ctl.select(args.alpha)
    q = sel.selected_thresholds
    kgs = [KGIndex.from_record(r) for r in test]
    trav = UAGTraversal(cache, args.max_hops)

    rows = []
    t_sel, results = best_time(lambda: [trav.run(r, *q, kg=kg, scratch=cache) for r, kg in zip(test, kgs)], args.repeat)
    rows.append((f"traversal at LTT selection (alpha={args.alpha:g})", t_sel, len(test)))
    t_full, full = best_time(
        lambda: [trav.run(r, math.inf, math.inf, math.inf, kg=kg, scratch=cache) for r, kg in zip(test, kgs)], 1
    )
    rows.append(("traversal, filters off (whole neighbourhood)", t_full, len(test)))
    t_score, scores = best_time(
        lambda: score_questions(test, cache, max_hops=args.max_hops, progress=False, store_question_texts=True), 1
    )
    rows.append(("scoring every path (calibration input)", t_score, len(test)))
    for res, s in zip(results, scores):
        assert set(res.answers) == {s.entities[i] for i in members_at(s, *q).nonzero().flatten().tolist()}
    ecr = sum(covers(s, members_at(s, *q)) for s in scores) / len(scores)
    apss = sum(len(r.answers) for r in results) / len(results)
    expanded = sum(r.expanded for r in results) / len(results)
    expanded_full = sum(r.expanded for r in full) / len(full)

    grid_q = pool[: args.n_grid]
    t1, t2, t3 = (t.float() for t in ctl.thresholds)
    t_grid, (cov, size) = best_time(lambda: grid_outcomes(grid_q, t1, t2, t3), args.repeat)

    def loop():
        K = len(t1) * len(t2) * len(t3)
        cv = torch.zeros(K, len(grid_q), dtype=torch.bool)
        sz = torch.zeros(K, len(grid_q), dtype=torch.long)
        for i, a in enumerate(t1.tolist()):
            for j, b in enumerate(t2.tolist()):
                for k, c in enumerate(t3.tolist()):
                    row = (i * len(t2) + j) * len(t3) + k
                    for n, s in enumerate(grid_q):
                        m = members_at(s, a, b, c)
                        cv[row, n], sz[row, n] = covers(s, m), int(m.sum())
        return cv, sz

    t_loop, (cov_l, size_l) = best_time(loop, 1)
    assert torch.equal(cov, cov_l) and torch.equal(size, size_l)
    K = cov.shape[0]

    print(f"# bench_uag  {date.today()}  {platform.processor() or platform.machine()}  torch {torch.__version__}")
    print(f"# encoder {args.encoder}; torch threads {torch.get_num_threads()}; max_hops {args.max_hops}")
    print(f"# first pass: {cold:.1f} s, encoding {len(cache) - cached} strings not yet cached ({cached} were)")
    print(f"# selection at alpha={args.alpha:g}: {sel.selected_alphas} -> test ECR {ecr:.3f}, APSS {apss:.1f}")
    print(f"# states expanded per question: {expanded:.1f} at the selection, {expanded_full:.1f} with filters off")
    print(f"{'what':48s} {'seconds':>9s} {'questions/s':>12s}")
    for name, t, n in rows:
        print(f"{name:48s} {t:9.3f} {n / t:12.1f}")
    print(
        f"grid: {K} configurations x {len(grid_q)} questions: grid_outcomes {t_grid:.3f} s, "
        f"members_at loop {t_loop:.2f} s, ratio {t_loop / t_grid:.0f}x (results equal)"
    )
    print(f"# peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
