"""forked_chunks: the chunks of one process, in order, from forked children."""

from __future__ import annotations

import os

import pytest

from kglightning.data.parallel import forked_chunks


def test_chunks_come_back_in_order_from_the_children():
    parent = os.getpid()
    parts = list(forked_chunks(lambda lo, hi: (os.getpid(), list(range(lo, hi))), 11, workers=3, chunk=3))
    assert [(lo, hi) for lo, hi, _ in parts] == [(0, 3), (3, 6), (6, 9), (9, 11)]
    assert [x for _, _, (_, xs) in parts for x in xs] == list(range(11))
    assert parent not in {pid for _, _, (pid, _) in parts}


def test_one_worker_or_one_chunk_runs_here_and_nothing_is_an_empty_run():
    parent = os.getpid()
    assert [p for _, _, p in forked_chunks(lambda lo, hi: os.getpid(), 5, workers=1, chunk=2)] == [parent] * 3
    assert [p for _, _, p in forked_chunks(lambda lo, hi: os.getpid(), 5, workers=4, chunk=8)] == [parent]
    assert list(forked_chunks(lambda lo, hi: 1 / 0, 0, workers=2)) == []


def test_a_failing_chunk_raises_in_the_parent_and_pools_do_not_nest():
    def job(lo, hi):
        if lo == 4:
            raise KeyError(f"bad chunk {lo}")
        return hi

    with pytest.raises(KeyError, match="bad chunk 4"):
        list(forked_chunks(job, 8, workers=2, chunk=2))

    def nested(lo, hi):
        return list(forked_chunks(lambda a, b: a, 4, workers=2, chunk=1))

    with pytest.raises(RuntimeError, match="cannot run while another"):
        list(forked_chunks(nested, 4, workers=2, chunk=2))
    assert [p for _, _, p in forked_chunks(lambda lo, hi: hi, 4, workers=2, chunk=2)] == [2, 4]  # usable again
    with pytest.raises(ValueError, match="workers"):
        list(forked_chunks(lambda lo, hi: 0, 4, workers=0))


def test_tensors_come_back_by_value_not_as_shared_memory_files():
    import torch

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    before = fds()
    parts = list(
        forked_chunks(lambda lo, hi: [torch.arange(i, i + 3) for i in range(lo, hi)], 600, workers=2, chunk=100)
    )
    got = [t for _, _, part in parts for t in part]
    assert len(got) == 600 and torch.equal(got[599], torch.arange(599, 602))
    assert fds() - before < 50  # the pool's own pipes at most, not one descriptor per tensor


def test_children_run_one_torch_thread():
    import torch

    threads = [n for _, _, n in forked_chunks(lambda lo, hi: torch.get_num_threads(), 4, workers=2, chunk=2)]
    assert threads == [1, 1]
