"""Make a CPU run fail where a GPU run would: package code that creates tensors on the default device.

On a GPU machine the default device stays the CPU while a module lives on ``cuda:k``. A tensor that package code
creates without ``device=`` inside a hook (a metric state, a logged value, a collective's buffer) then lands on the
CPU: PyTorch refuses to mix it with the module's tensors, and NCCL refuses it in a collective. On a CPU-only machine
both devices are the CPU and nothing shows. :class:`DeviceTrap` closes that gap for tests: while it is active, a
tensor constructor (``torch.tensor``, ``torch.full``, ``torch.zeros``...) called without ``device=`` from package
code builds the tensor on the ``meta`` device, which holds no data, so the first use beside a real tensor (or the
first ``.item()``) raises, as the GPU run would.

What counts as package code: the nearest caller frame that lies in ``kglightning`` (frames inside torch, torchmetrics
and torch_geometric are looked through, so a torchmetrics ``Metric`` built by package code inside a hook is caught).
Data preparation (``kglightning.data``, ``kglightning.datamodules``, torch's ``default_collate``) builds CPU batches by
design, before Lightning moves them, and is not trapped; neither is Lightning's own bookkeeping, nor test code.

The trap is stricter than CUDA in one way: a 0-dim CPU tensor mixes with CUDA tensors, but not with a real one here.
Package code follows the stricter rule (``DESIGN.md``, "Device discipline"): tensors take ``device=`` from their
inputs, or name ``device="cpu"`` where the CPU is meant.

Example:
    >>> import torch
    >>> from kglightning.metrics.classification import detection_metrics
    >>> with DeviceTrap() as trap:
    ...     metrics = detection_metrics()  # package code, states made without device=
    ...     mine = torch.zeros(2)  # not package code: untouched
    >>> metrics["f1"].tp.device, mine.device, len(trap.sites) > 0
    (device(type='meta'), device(type='cpu'), True)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors

__all__ = ["DeviceTrap", "DeviceTrapCallback"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _folder(module: Any) -> str:
    return os.path.dirname(os.path.abspath(module.__file__))


def _library_folders() -> tuple[str, ...]:
    import torch_geometric
    import torchmetrics

    return tuple(_folder(module) + os.sep for module in (torch, torchmetrics, torch_geometric))


class DeviceTrap(TorchFunctionMode):
    """A torch function mode that builds package-made default-device tensors on ``meta`` (see the module docstring).

    Args:
        watch: top-level parts of the package that are trapped (default: every part except ``data``,
            ``datamodules`` and ``testing``).
        package: the package folder (default: kglightning's).

    Attributes:
        sites: ``"file:line"`` of every trapped constructor call, in order (for the failure message).
    """

    EXEMPT = ("data", "datamodules", "testing")

    def __init__(self, watch: Iterable[str] | None = None, package: str = _PACKAGE) -> None:
        super().__init__()
        self.watch = None if watch is None else frozenset(watch)
        self.package = package + os.sep
        self.libraries = _library_folders()
        # torch's data loading (default_collate) builds CPU batches by design, like the package's own data code
        self.data_loading = os.path.join(_folder(torch), "utils", "data") + os.sep
        self.constructors = _device_constructors()
        self.sites: list[str] = []

    def _watched_site(self, frame: FrameType | None) -> str | None:
        """``"file:line"`` of the package frame that decides, if it is watched; ``None`` otherwise."""
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(self.package):
                part = name[len(self.package) :].split(os.sep)[0].removesuffix(".py")
                watched = part in self.watch if self.watch is not None else part not in self.EXEMPT
                return f"{name[len(self.package) :]}:{frame.f_lineno}" if watched else None
            if name.startswith(self.data_loading) or not name.startswith(self.libraries):
                return None
            frame = frame.f_back
        return None

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in self.constructors and kwargs.get("device") is None:
            from_tensor = bool(args) and isinstance(args[0], torch.Tensor)  # torch.tensor(t) keeps t's device
            site = None if from_tensor else self._watched_site(sys._getframe(1))
            if site is not None:
                self.sites.append(site)
                kwargs = {**kwargs, "device": "meta"}
        return func(*args, **kwargs)


def _callback_base() -> type:
    from lightning.pytorch.callbacks import Callback

    return Callback


class DeviceTrapCallback(_callback_base()):  # type: ignore[misc]
    """Activates a :class:`DeviceTrap` from the start of ``fit``/``validate``/``test``/``predict`` (after Lightning
    has moved the module to its device) to the end, so that every hook and step runs under it.

    Args:
        trap: the trap (default: a new :class:`DeviceTrap`); its ``sites`` list what it caught.
    """

    def __init__(self, trap: DeviceTrap | None = None) -> None:
        self.trap = trap or DeviceTrap()
        self._stage: str | None = None

    def _enter(self, stage: str) -> None:
        if self._stage is None:
            self.trap.__enter__()
            self._stage = stage

    def _exit(self, stage: str | None = None) -> None:
        if self._stage is not None and stage in (None, self._stage):
            self._stage = None
            self.trap.__exit__(None, None, None)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._enter("fit")

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._exit("fit")

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._enter("validate")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        self._exit("validate")

    def on_test_start(self, trainer: Any, pl_module: Any) -> None:
        self._enter("test")

    def on_test_end(self, trainer: Any, pl_module: Any) -> None:
        self._exit("test")

    def on_predict_start(self, trainer: Any, pl_module: Any) -> None:
        self._enter("predict")

    def on_predict_end(self, trainer: Any, pl_module: Any) -> None:
        self._exit("predict")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._exit()
