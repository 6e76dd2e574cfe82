"""LTT grid calibration benchmark: the vectorised functional code against per-configuration Python loops.

On the same seeded grid of ``K`` configurations x ``n`` calibration questions (binary losses with risks spread
around ``alpha``) and a ``(K, n_sel)`` selection split, in one run:
  * ours: ``ltt_select`` (binomial and Hoeffding-Bentkus p-values, Bonferroni and fixed-sequence) and
    ``conformal_quantile`` on a ``(K, n)`` score grid, each one call for the whole grid;
  * loop (scipy): per configuration ``scipy.stats.binom.cdf(sum L, n, alpha)``, then Bonferroni and the argmin of
    mean set size in Python; per-row ``np.sort`` + exact rank for the quantile;
  * loop (ours per row): ``binomial_tail_pvalue`` / ``conformal_quantile`` called once per configuration.
Results are asserted equal before times are printed. Times are CPU times (``time.process_time``), best of
``--repeat``, with ``torch.set_num_threads(1)`` so that both sides use one core (the loops are single-threaded,
and on a shared 2-core machine intra-op threads mostly add contention); peak RSS of the process is printed at the end.

    python tools/bench/bench_ltt.py [--K 1000] [--n 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import platform
import resource
import time
from datetime import date

import numpy as np
import torch
from scipy import stats

from kglightning.conformal import (
    binomial_tail_pvalue,
    bonferroni,
    conformal_quantile,
    conformal_rank,
    ltt_select,
)


def best_time(fn, repeat: int):
    best, out = math.inf, None
    for _ in range(repeat):
        t0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--K", type=int, default=1000)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--n-sel", type=int, default=500)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--delta", type=float, default=0.1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    K, n, alpha, delta = args.K, args.n, args.alpha, args.delta
    gen = torch.Generator().manual_seed(0)
    risks = torch.linspace(0.0, 3 * alpha, K, dtype=torch.float64)[:, None]
    losses = (torch.rand(K, n, generator=gen, dtype=torch.float64) < risks).double()
    sizes = torch.rand(K, args.n_sel, generator=gen, dtype=torch.float64) * torch.linspace(10, 1, K)[:, None]
    scores = torch.rand(K, n, generator=gen, dtype=torch.float64)

    def loop_scipy_ltt():
        L, S = losses.numpy(), sizes.numpy()
        p = [float(stats.binom.cdf(L[j].sum(), n, alpha)) for j in range(K)]
        valid = [pj <= delta / K for pj in p]
        means = [float(S[j].mean()) for j in range(K)]
        cands = [j for j in range(K) if valid[j]]
        return min(cands, key=lambda j: (means[j], j)) if cands else None, np.array(p)

    def loop_ours_pvalues():
        return torch.stack([binomial_tail_pvalue(losses[j], alpha) for j in range(K)])

    rows = []
    t_ours, res = best_time(lambda: ltt_select(losses, sizes, alpha, delta, procedure="bonferroni"), args.repeat)
    t_loop, (idx_loop, p_loop) = best_time(loop_scipy_ltt, args.repeat)
    t_loop_ours, p_loop_ours = best_time(loop_ours_pvalues, args.repeat)
    assert res.index == idx_loop, (res.index, idx_loop)
    np.testing.assert_allclose(res.pvalues.numpy(), p_loop, rtol=1e-9, atol=1e-300)
    assert torch.equal(bonferroni(p_loop_ours, delta), res.valid)
    rows.append(("ltt_select binomial+bonferroni", t_ours, t_loop, t_loop_ours))
    for pv in ("binomial", "hoeffding_bentkus"):
        t, _ = best_time(lambda pv=pv: ltt_select(losses, sizes, alpha, delta, pvalue=pv), args.repeat)
        rows.append((f"ltt_select {pv}+fixed_sequence", t, float("nan"), float("nan")))

    S = scores.numpy()
    k = int(conformal_rank(n, alpha))

    def loop_np_quantile():
        return np.array([np.sort(S[j])[k - 1] if k <= n else np.inf for j in range(K)])

    t_q, q = best_time(lambda: conformal_quantile(scores, alpha), args.repeat)
    t_q_loop, q_loop = best_time(loop_np_quantile, args.repeat)
    t_q_loop_ours, q_loop_ours = best_time(
        lambda: torch.stack([conformal_quantile(scores[j], alpha) for j in range(K)]), args.repeat
    )
    assert np.array_equal(q.numpy(), q_loop) and torch.equal(q, q_loop_ours)
    rows.append(("conformal_quantile", t_q, t_q_loop, t_q_loop_ours))

    print(f"# bench_ltt  {date.today()}  {platform.processor() or platform.machine()}  torch {torch.__version__}")
    print(f"# torch threads {torch.get_num_threads()}")
    print(f"# grid K={K} configurations x n={n} calibration questions, n_sel={args.n_sel}; results asserted equal")
    print(f"{'what':44s} {'ours s':>9s} {'loop scipy/np s':>16s} {'ratio':>7s} {'loop ours s':>12s} {'ratio':>7s}")
    for name, a, b, c in rows:
        print(f"{name:44s} {a:9.4f} {b:16.4f} {b / a:7.1f} {c:12.4f} {c / a:7.1f}")
    print(f"# peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
