"""The GPU tier's own code stays runnable: tests/gpu dry-run on the CPU (gloo instead of NCCL, no faiss-gpu).

This shows nothing about GPUs; it keeps the tier from rotting between the sessions that have one
(``bash tools/gpu_check.sh`` on a GPU machine is the real run).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_the_gpu_tier_dry_runs_on_the_cpu(tmp_path):
    env = dict(
        os.environ, KGLIGHTNING_GPU_TIER_ON_CPU="1", KGLIGHTNING_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1"
    )
    # as tools/gpu_check.sh: pytest.ini's options cleared, so the tier runs in one process (one GPU, timings) and needs
    # no pytest-xdist (the device machines' own image has none; ours installs it)
    args = [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-o", "addopts=", "--strict-markers", "-q",
            "-p", "no:cacheprovider", "-rA"]  # fmt: skip
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-6000:]
    passed = [line for line in proc.stdout.splitlines() if line.startswith("PASSED ")]
    assert len(passed) >= 8, proc.stdout[-3000:]
