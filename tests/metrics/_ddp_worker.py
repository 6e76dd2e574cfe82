"""Worker for test_metrics_ddp.py; a separate module so that spawned processes can import it in any import mode."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from kglightning.metrics import (
    AnswerF1,
    AnswerHits1,
    AverageSetSize,
    BrierScore,
    EmpiricalCoverage,
    ExactMatch,
    ExpectedCalibrationError,
    MaximumCalibrationError,
    RoGAnswerMetrics,
)


def make_data():
    """A small dataset covering every metric family (uneven across 2 ranks on purpose)."""
    preds = [["Paris"], "Rome\nLyon\n", ["x"], ["Nice", "Nice", "Oslo"], ["Barack Obama"], [], ["New", "York"]]
    golds = [["Paris"], ["Lyon", "Nice"], [], ["Oslo"], ["Obama", "Barack"], ["Bern"], ["New York", "NYC"]]
    g = torch.Generator().manual_seed(0)
    conf = torch.rand(101, generator=g)
    conf[::10] = 1.0
    correct = torch.rand(101, generator=g) < conf
    sets = torch.rand(9, 6, generator=g) < 0.4
    gold_sets = torch.rand(9, 6, generator=g) < 0.3
    return preds, golds, conf, correct, sets, gold_sets


def build_metrics():
    return {
        "rog": RoGAnswerMetrics(),
        "f1": AnswerF1(),
        "hit1": AnswerHits1(),
        "em": ExactMatch(),
        "ece": ExpectedCalibrationError(n_bins=7),
        "mce": MaximumCalibrationError(n_bins=7),
        "brier": BrierScore(),
        "cov_any": EmpiricalCoverage(mode="any"),
        "cov_all": EmpiricalCoverage(mode="all"),
        "size": AverageSetSize(),
    }


def run_metrics(rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
    """Update every metric with this rank's share (items ``rank::world_size``, two batches) and compute."""
    preds, golds, conf, correct, sets, gold_sets = make_data()
    metrics = build_metrics()

    def share(seq):
        return seq[rank::world_size]

    p, gl = share(preds), share(golds)
    c, y = conf[rank::world_size], correct[rank::world_size]
    s, gs = sets[rank::world_size], gold_sets[rank::world_size]
    for half in (slice(None, 2), slice(2, None)):
        for k in ("rog", "f1", "hit1", "em"):
            metrics[k].update(p[half], gl[half])
        for k in ("ece", "mce", "brier"):
            metrics[k].update(c[half], y[half])
        for k in ("cov_any", "cov_all"):
            metrics[k].update(s[half], gs[half])
        metrics["size"].update(s[half])
    out = {}
    for name, m in metrics.items():
        value = m.compute()
        if isinstance(value, dict):
            out.update({f"{name}/{k}": v for k, v in value.items()})
        else:
            out[name] = value
    return out


def worker(rank: int, world_size: int, init_file: str, expected: dict[str, torch.Tensor]) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        got = run_metrics(rank, world_size)
        assert set(got) == set(expected)
        for k, v in expected.items():
            assert torch.allclose(got[k].double(), v.double(), atol=1e-9, equal_nan=True), (k, got[k], v)
    finally:
        dist.destroy_process_group()
