"""Under DDP (2 CPU processes, gloo) every Metric class computes the single-process value."""

import importlib
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")


def _worker_module():
    here = str(Path(__file__).parent)
    if here not in sys.path:
        sys.path.insert(0, here)  # spawned children inherit sys.path, so they can import it too
    return importlib.import_module("_ddp_worker")


@pytest.mark.heavy
@pytest.mark.timeout(120)
def test_ddp_two_processes_equal_single_process(tmp_path):
    w = _worker_module()
    expected = w.run_metrics()
    assert expected["rog/f1"].item() > 0 and expected["ece"].item() > 0 and expected["size"].item() > 0
    mp.spawn(w.worker, args=(2, str(tmp_path / "dist_init"), expected), nprocs=2, join=True)
