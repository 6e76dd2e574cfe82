"""How many threads torch computes with, and how its idle threads wait (floor 0: imports nothing of kglightning).

torch starts as many OpenMP threads as the machine has cores, and its idle threads spin for a while before they
sleep. Two such processes on the same cores take turns at every spin: on 2 cores, two fits of the main job started
together each took 19 times as long as one alone (``tools/bench/bench_threads.py``, BENCHMARKS.md, "Two torch jobs
on the same cores"). The CLI therefore

* lets idle threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``, :func:`sleep_when_idle`), set before torch is
  imported unless the environment sets ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` already, and
* computes with the CPUs this process may use (:func:`available_cpus`: its affinity mask, and a cgroup CPU quota
  in a container) rather than the machine's cores, or with ``KGLIGHTNING_THREADS`` (a count) when set,

and says once what it chose (:func:`apply_threads`). Measured on 2 cores (BENCHMARKS.md): sleeping at once cost
about a sixth of the training speed alone and made two fits together each train about half again as long; a brief
spin (``GOMP_SPINCOUNT=10000``) made them each train about four times as long, and torch's own policy up to sixty.
Set ``OMP_WAIT_POLICY=ACTIVE`` for a machine you know is yours. In your own Python code, call
:func:`sleep_when_idle` before importing torch, and :func:`apply_threads` after.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

#: environment variable: the number of threads torch computes with (default: :func:`available_cpus`)
ENV_THREADS = "KGLIGHTNING_THREADS"


def sleep_when_idle() -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the environment chose how idle threads wait (``OMP_WAIT_POLICY`` or
    libgomp's ``GOMP_SPINCOUNT``): OpenMP reads them when torch is first imported, so this must run before that."""
    for name in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY"):
        if name in os.environ and not os.environ[name].strip():
            del os.environ[name]  # an empty value is no choice (libgomp calls it invalid and spins long)
    if "GOMP_SPINCOUNT" not in os.environ:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _cgroup_quota(root: Path = Path("/sys/fs/cgroup"), proc: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPUs a cgroup quota allows this process (the smallest over its cgroup and those above it), or ``None``
    when none is set or it cannot be read. cgroup v2 (``cpu.max``: ``quota period``) and v1
    (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            folders = [root / path.lstrip("/"), *(root / path.lstrip("/")).parents]
            for folder in folders:
                if folder != root and root not in folder.parents:
                    break
                try:
                    quota, period = (folder / "cpu.max").read_text().split()[:2]
                except (OSError, ValueError):
                    continue
                if quota != "max":
                    quotas.append(int(quota) / int(period))
        elif "cpu" in controllers.split(","):  # v1
            for folder in (root / "cpu" / path.lstrip("/"), root / "cpu"):
                try:
                    quota = int((folder / "cpu.cfs_quota_us").read_text())
                    period = int((folder / "cpu.cfs_period_us").read_text())
                except (OSError, ValueError):
                    continue
                if quota > 0 and period > 0:
                    quotas.append(quota / period)
                break
    return min(quotas) if quotas else None


def available_cpus() -> int:
    """The CPUs this process may use: those of its affinity mask (``os.sched_getaffinity``), at most the whole
    number of CPUs a cgroup quota allows (at least 1)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        n = min(n, max(1, math.floor(quota)))
    return n


def chosen_threads() -> tuple[int, str]:
    """The thread count and why: ``KGLIGHTNING_THREADS`` when set, else :func:`available_cpus`.

    Raises:
        ValueError: ``KGLIGHTNING_THREADS`` is not a positive whole number.
    """
    value = os.environ.get(ENV_THREADS, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{ENV_THREADS}={value!r}: expected a positive whole number of threads")
        return int(value), f"{ENV_THREADS}={value}"
    return available_cpus(), "the CPUs this process may use"


def apply_threads() -> str:
    """Set torch's thread count to :func:`chosen_threads` (unless ``OMP_NUM_THREADS`` is set, which torch already
    follows) and return the line that says what it is, for the caller to show once."""
    import torch

    if "GOMP_SPINCOUNT" in os.environ:  # libgomp reads it before OMP_WAIT_POLICY
        wait = f"spin GOMP_SPINCOUNT={os.environ['GOMP_SPINCOUNT']} times, then sleep"
    else:
        wait = os.environ.get("OMP_WAIT_POLICY", "spin (the OpenMP runtime's default)")
    if os.environ.get("OMP_NUM_THREADS"):
        n, why = torch.get_num_threads(), "OMP_NUM_THREADS"
    else:
        n, why = chosen_threads()
        why = f"{why}; {ENV_THREADS} sets it"
        torch.set_num_threads(n)
    return f"torch computes with {n} thread{'s' if n != 1 else ''} ({why}), idle threads: {wait}"
