"""Per-question preparation over forked processes, with the results of one process in the same order.

The preparation steps that run question by question (PCST cuts, evidence mining, detector graphs) split the
questions into contiguous chunks and run the chunks on ``workers`` forked processes. Forking shares what the parent
holds (the records, a KG index, an embedding table) with the children without copying or pickling it; each chunk's
result comes back pickled, and the chunks are put back in question order, so the output does not depend on
``workers``.

Example:
    >>> squares = [x * x for x in range(10)]
    >>> parts = forked_chunks(lambda lo, hi: squares[lo:hi], 10, workers=2, chunk=4)
    >>> [(lo, hi, part) for lo, hi, part in parts]
    [(0, 4, [0, 1, 4, 9]), (4, 8, [16, 25, 36, 49]), (8, 10, [64, 81])]
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import pickle
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any, TypeVar

import torch

__all__ = ["forked_chunks", "torch_threads"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_JOB: Callable[[int, int], Any] | None = None  # the job of the running forked_chunks; the children inherit it


def _run(lo: int, hi: int) -> bytes:
    """A chunk in a child, its result pickled here: plain pickle copies tensors by value, where the pool's own
    pickler would hand each tensor over as a shared-memory file that holds a descriptor in the parent for as long
    as the tensor lives (thousands of graphs exhaust the process's descriptors)."""
    assert _JOB is not None, "forked_chunks: the job is set before the processes fork"
    return pickle.dumps(_JOB(lo, hi), protocol=pickle.HIGHEST_PROTOCOL)


def forked_chunks(
    job: Callable[[int, int], T], n: int, workers: int = 1, chunk: int = 32
) -> Iterator[tuple[int, int, T]]:
    """``(lo, hi, job(lo, hi))`` for the contiguous chunks of ``range(n)``, in order.

    Args:
        job: the work on items ``lo:hi``; with ``workers > 1`` it runs in a forked child with one torch thread, so
            it sees the parent's state as it was when the pool started, and its result must pickle (it is copied
            back, tensors included). A child must not use CUDA (a forked process cannot).
        n: the number of items.
        workers: processes; ``1`` (or a platform that cannot fork, with a warning) runs the chunks here.
        chunk: items per chunk.

    Raises:
        ValueError: ``workers`` or ``chunk`` below 1.
        RuntimeError: ``workers > 1`` while another such call runs or is paused in this process (pools do not
            nest).
    """
    global _JOB
    if workers < 1 or chunk < 1:
        raise ValueError(f"workers and chunk must be >= 1, got workers={workers}, chunk={chunk}")
    if workers > 1 and "fork" not in mp.get_all_start_methods():
        log.warning("this platform cannot fork; the work runs in one process")
        workers = 1
    spans = [(lo, min(lo + chunk, n)) for lo in range(0, n, chunk)]
    if workers == 1 or len(spans) < 2:
        for lo, hi in spans:
            yield lo, hi, job(lo, hi)
        return
    if _JOB is not None:
        raise RuntimeError("forked_chunks cannot run while another forked_chunks job runs (or is paused) here")
    _JOB = job
    try:
        # one torch thread per child: a forked child that used the parent's OpenMP pool would hang
        with ProcessPoolExecutor(
            min(workers, len(spans)), mp_context=mp.get_context("fork"), initializer=torch.set_num_threads,
            initargs=(1,),
        ) as pool:  # fmt: skip
            for (lo, hi), part in zip(spans, pool.map(_run, *zip(*spans))):
                yield lo, hi, pickle.loads(part)
    finally:
        _JOB = None


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads (the same arithmetic in every process), then restore the count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
