"""Which device and dtype a component runs on when the user says ``"auto"``, per DDP process.

Under DDP every process owns one GPU: Lightning makes it torch's current CUDA device (``torch.cuda.set_device``), and
launchers export ``LOCAL_RANK``. Components that are not LightningModules (an LLM backend, a faiss index, a sentence
encoder) ask :func:`local_gpu` instead of assuming GPU 0, so that N processes do not all crowd onto one card.

Example:
    >>> resolve_device("cpu"), resolve_device("cuda:1")  # explicit names are kept
    ('cpu', 'cuda:1')
    >>> resolve_dtype("float16", "cpu"), resolve_dtype("auto", "cpu")
    ('float16', 'float32')
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

__all__ = ["all_gather_objects", "local_gpu", "resolve_device", "resolve_dtype"]

log = logging.getLogger(__name__)


def local_gpu() -> int:
    """This process's GPU index: torch's current CUDA device once CUDA is initialised (Lightning sets it to the
    rank's), else ``LOCAL_RANK`` (0 without one)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    rank = os.environ.get("LOCAL_RANK", "0")
    try:
        return int(rank)
    except ValueError:
        raise ValueError(f"LOCAL_RANK must be an integer, got {rank!r}") from None


def resolve_device(device: str) -> str:
    """``"auto"``: this process's GPU (``cuda:<local_gpu()>``) when CUDA is available, else ``"cpu"``; any other
    name is returned as given."""
    if device != "auto":
        return device
    if not torch.cuda.is_available():
        return "cpu"
    gpu = local_gpu()
    if gpu >= torch.cuda.device_count():
        raise RuntimeError(
            f"this process's GPU is {gpu} (LOCAL_RANK), but only {torch.cuda.device_count()} are visible"
        )
    return f"cuda:{gpu}"


def resolve_dtype(dtype: str, device: str) -> str:
    """``"auto"``: ``bfloat16`` on a GPU that supports it, ``float16`` on an older GPU, ``float32`` on the CPU; any
    other name is returned as given."""
    if dtype != "auto":
        return dtype
    if torch.device(device).type != "cuda":
        return "float32"
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def all_gather_objects(obj: Any) -> list[Any]:
    """Every DDP process's ``obj`` (any picklable value, e.g. tensors of different lengths, on the CPU), in rank
    order; ``[obj]`` without a process group of several. Every process must call it.

    Example:
        >>> all_gather_objects({"questions": 3})  # one process
        [{'questions': 3}]
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, obj)
    return parts
