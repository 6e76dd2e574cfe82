"""tools/check_faiss.py: the faiss install check passes here (CPU) and catches the failures it is meant to catch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "check_faiss.py"


@pytest.fixture(scope="module")
def check_faiss():
    spec = importlib.util.spec_from_file_location("check_faiss", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_passes_on_this_install():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "CPU flat indexes (L2, cosine): ok" in proc.stdout
    assert proc.stdout.rstrip().endswith("faiss check: ok")


def test_wrong_build_expectation_fails(check_faiss):
    import faiss

    other = "cpu" if hasattr(faiss, "StandardGpuResources") else "gpu"
    errors = check_faiss.check(expect=other, log=lambda _: None)
    assert any("expected" in e for e in errors)
    assert check_faiss.main(["--expect", other]) == 1


def test_require_gpu_fails_without_gpu(check_faiss):
    import faiss

    if hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0:
        pytest.skip("a GPU is present")
    assert any("--require-gpu" in e for e in check_faiss.check(require_gpu=True, log=lambda _: None))


def test_two_faiss_distributions_are_an_error(check_faiss, monkeypatch):
    monkeypatch.setattr(
        check_faiss, "installed_faiss_distributions", lambda: {"faiss-cpu": "1.15.1", "faiss-gpu-cu12": "1.14.1"}
    )
    (error,) = check_faiss.check(log=lambda _: None)
    assert "2 faiss distributions installed" in error


def test_wrong_neighbours_are_reported(check_faiss):
    base, queries, ids = check_faiss.make_data()
    want = check_faiss.exact_knn(base, queries, check_faiss.K, "l2")
    assert np.array_equal(want[1][:, 0], ids)  # the known answer: each query is a perturbed base row
    assert check_faiss.compare("x", want, want, ids) == []
    d, i = want
    shifted = (d, np.roll(i, 1, axis=0))
    errors = check_faiss.compare("x", shifted, want, ids)
    assert any("nearest neighbours" in e for e in errors)
    assert check_faiss.compare("x", (d + 1.0, i), want, ids)[0].startswith("x: distances differ")


def test_setup_extras_never_pull_two_faiss_builds(check_faiss, monkeypatch):
    import runpy

    import setuptools

    captured = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: captured.update(kw))
    runpy.run_path(str(SCRIPT.parents[1] / "setup.py"))

    def faiss_builds(reqs):
        return {r.split(">")[0].split("=")[0].strip() for r in reqs} & set(check_faiss.FAISS_DISTRIBUTIONS)

    assert faiss_builds(captured["install_requires"]) == set()
    extras = captured["extras_require"]
    assert faiss_builds(extras["cpu"]) == faiss_builds(extras["all"]) == {"faiss-cpu"}
    assert faiss_builds(extras["gpu"]) == faiss_builds(extras["gpu-all"]) == {"faiss-gpu-cu12"}
    assert all(len(faiss_builds(reqs)) <= 1 for reqs in extras.values())
