"""``"auto"`` devices and dtypes resolve per DDP process: the rank's own GPU, never GPU 0 for everyone."""

from __future__ import annotations

import pytest
import torch

from kglightning.data.devices import local_gpu, resolve_device, resolve_dtype


@pytest.fixture
def four_gpus(monkeypatch):
    """What torch reports on a 4-GPU machine before CUDA is initialised (nothing runs on a GPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)


def test_auto_is_the_cpu_without_cuda_and_names_are_kept(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu" and resolve_dtype("auto", "cpu") == "float32"
    assert resolve_device("cuda:3") == "cuda:3" and resolve_dtype("float16", "cuda:0") == "float16"


def test_auto_is_the_local_rank_gpu(four_gpus, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert local_gpu() == 2 and resolve_device("auto") == "cuda:2"
    monkeypatch.delenv("LOCAL_RANK")
    assert resolve_device("auto") == "cuda:0"
    monkeypatch.setenv("LOCAL_RANK", "5")
    with pytest.raises(RuntimeError, match="GPU is 5 .* only 4 are visible"):
        resolve_device("auto")
    monkeypatch.setenv("LOCAL_RANK", "two")
    with pytest.raises(ValueError, match="LOCAL_RANK must be an integer"):
        local_gpu()


def test_once_cuda_is_initialised_the_current_device_wins(four_gpus, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)  # what Lightning's set_device made it
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == "cuda:3"


@pytest.mark.parametrize(("bf16", "expected"), [(True, "bfloat16"), (False, "float16")])
def test_auto_dtype_on_a_gpu(bf16, expected, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    assert resolve_dtype("auto", "cuda:1") == expected
