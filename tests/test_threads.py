"""kglightning.threads: torch's thread count from the CPUs a process may use, and idle threads that sleep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kglightning import threads

ROOT = Path(__file__).resolve().parents[1]


def _cgroups(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (tmp_path / "self").write_text(proc)
    return root, tmp_path / "self"


def test_a_cgroup_v2_quota_is_the_smallest_of_the_process_cgroup_and_those_above(tmp_path):
    root, proc = _cgroups(tmp_path, "0::/box/job\n", {"box/cpu.max": "150000 100000\n", "box/job/cpu.max": "max 100000\n",
                                                       "cpu.max": "400000 100000\n"})  # fmt: skip
    assert threads._cgroup_quota(root, proc) == 1.5
    root, proc = _cgroups(tmp_path / "none", "0::/\n", {"cpu.max": "max 100000\n"})
    assert threads._cgroup_quota(root, proc) is None


def test_a_cgroup_v1_quota_is_read_and_an_unlimited_one_is_none(tmp_path):
    root, proc = _cgroups(tmp_path, "4:cpu,cpuacct:/docker/abc\n",
                          {"cpu/docker/abc/cpu.cfs_quota_us": "200000\n", "cpu/docker/abc/cpu.cfs_period_us": "100000\n"})  # fmt: skip
    assert threads._cgroup_quota(root, proc) == 2.0
    root, proc = _cgroups(tmp_path / "u", "4:cpu:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "1\n"})
    assert threads._cgroup_quota(root, proc) is None
    assert threads._cgroup_quota(tmp_path, tmp_path / "missing") is None


def test_available_cpus_is_the_affinity_less_a_quota(monkeypatch):
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: None)
    assert threads.available_cpus() == 4
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: 2.5)
    assert threads.available_cpus() == 2
    monkeypatch.setattr(threads, "_cgroup_quota", lambda: 0.5)
    assert threads.available_cpus() == 1


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5"])
def test_a_bad_thread_count_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv(threads.ENV_THREADS, value)
    with pytest.raises(ValueError, match=f"KGLIGHTNING_THREADS={value!r}"):
        threads.chosen_threads()


def test_apply_threads_sets_torch_and_says_so(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.setenv(threads.ENV_THREADS, "1")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    try:
        line = threads.apply_threads()
        assert torch.get_num_threads() == 1
        assert line == "torch computes with 1 thread (KGLIGHTNING_THREADS=1; KGLIGHTNING_THREADS sets it), " \
                       "idle threads: PASSIVE"  # fmt: skip
        monkeypatch.setenv("GOMP_SPINCOUNT", "10000")  # libgomp reads it first
        assert threads.apply_threads().endswith("idle threads: spin GOMP_SPINCOUNT=10000 times, then sleep")
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert "(OMP_NUM_THREADS)" in threads.apply_threads()
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("given", "expected"),
    [({}, "PASSIVE None"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE None"), ({"GOMP_SPINCOUNT": "5"}, "None 5")],
)
def test_the_cli_lets_idle_threads_sleep_unless_told_otherwise(given, expected):
    code = ("import os, sys; from kglightning.cli import main\n"
            "try: main(['select', '--help'])\nexcept SystemExit: pass\n"
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), 'torch' in sys.modules)")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(given)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    assert out.stdout.strip().splitlines()[-1] == f"{expected} False"  # set before torch is imported


def test_an_empty_wait_setting_is_no_choice(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "")
    monkeypatch.setenv("GOMP_SPINCOUNT", " ")
    threads.sleep_when_idle()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ


@pytest.mark.parametrize("given", [{"GOMP_SPINCOUNT": "77"}, {"OMP_WAIT_POLICY": "ACTIVE"}])
def test_a_wait_policy_the_environment_sets_is_kept(monkeypatch, given):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    for k, v in given.items():
        monkeypatch.setenv(k, v)
    threads.sleep_when_idle()
    assert {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")} == {
        "OMP_WAIT_POLICY": given.get("OMP_WAIT_POLICY"), "GOMP_SPINCOUNT": given.get("GOMP_SPINCOUNT")}  # fmt: skip
    monkeypatch.delenv(next(iter(given)))
    threads.sleep_when_idle()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ


def test_an_empty_spin_count_beside_a_policy_is_dropped_and_the_policy_kept(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    monkeypatch.setenv("GOMP_SPINCOUNT", "")
    threads.sleep_when_idle()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE" and "GOMP_SPINCOUNT" not in os.environ
