"""Which device and collective backend this process uses: CUDA + nccl when a GPU is visible, Ascend NPU + hccl
when ``torch_npu`` provides one, else CPU + gloo.

veRL's ``is_cuda_available`` / ``is_npu_available`` are module-level booleans while older verl code calls them;
here both are flags that work either way (``if is_cuda_available:`` and ``is_cuda_available()``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "auto_set_device",
    "cpu_has_native_bf16",
    "get_device_id",
    "get_device_name",
    "get_nccl_backend",
    "get_torch_device",
    "get_visible_devices_keyword",
    "is_cuda_available",
    "is_npu_available",
    "set_expandable_segments",
    "warn_if_bf16_is_emulated",
]

logger = logging.getLogger(__name__)


class _DeviceFlag:
    """A boolean that is re-checked on each use and can also be called: ``bool(flag) == flag()``."""

    def __init__(self, name: str, check: Callable[[], bool]) -> None:
        self._name = name
        self._check = check

    def __call__(self) -> bool:
        return bool(self._check())

    def __bool__(self) -> bool:
        return self()

    def __eq__(self, other: object) -> bool:
        return self() == other if isinstance(other, bool | int) else NotImplemented

    def __hash__(self) -> int:
        return hash(self())

    def __repr__(self) -> str:
        return f"{self._name}={self()}"


def _npu_available() -> bool:
    npu = getattr(torch, "npu", None)  # present once torch_npu is imported
    try:
        return bool(npu is not None and callable(getattr(npu, "is_available", None)) and npu.is_available())
    except Exception:  # a broken torch_npu install: treat as absent
        return False


is_cuda_available = _DeviceFlag("is_cuda_available", torch.cuda.is_available)
is_npu_available = _DeviceFlag("is_npu_available", _npu_available)


def get_device_name() -> str:
    """``"cuda"`` when a CUDA device is visible, ``"npu"`` for Ascend, else ``"cpu"``."""
    if is_cuda_available():
        return "cuda"
    if is_npu_available():
        return "npu"
    return "cpu"


class _CPUDevice:
    """``torch.cpu`` plus the memory statistics veRL's worker code reads from the device module (``torch.cpu`` has
    none): the process's peak resident memory (``max_*``) and its current resident memory, in bytes."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        import resource

        peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB
        return max(peak, _CPUDevice.memory_allocated())

    max_memory_reserved = max_memory_allocated

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        import psutil

        return int(psutil.Process().memory_info().rss)

    memory_reserved = memory_allocated

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        """Nothing to reset: the peak is the process's (``getrusage``)."""


_CPU_DEVICE = _CPUDevice()


def get_torch_device() -> Any:
    """The torch device module: ``torch.cuda``, ``torch.npu``, or on CPU ``torch.cpu`` with process memory
    statistics (:class:`_CPUDevice`)."""
    name = get_device_name()
    return _CPU_DEVICE if name == "cpu" else getattr(torch, name)


def get_device_id() -> int | str:
    """The index of this process's current accelerator; ``"cpu"`` on CPU (as veRL's, so ``tensor.to(get_device_id())``
    written for veRL stays on the CPU)."""
    name = get_device_name()
    return "cpu" if name == "cpu" else get_torch_device().current_device()


def get_nccl_backend() -> str:
    """The torch.distributed backend for this device: ``"nccl"`` on CUDA, ``"hccl"`` on NPU, ``"gloo"`` on CPU."""
    return {"cuda": "nccl", "npu": "hccl"}.get(get_device_name(), "gloo")


def get_visible_devices_keyword() -> str:
    """The environment variable that selects visible accelerators: ``CUDA_VISIBLE_DEVICES`` (also on CPU-only
    machines) or ``ASCEND_RT_VISIBLE_DEVICES`` on NPU."""
    return "ASCEND_RT_VISIBLE_DEVICES" if get_device_name() == "npu" else "CUDA_VISIBLE_DEVICES"


def set_expandable_segments(enable: bool) -> None:
    """Turn the CUDA caching allocator's expandable segments on or off (reduces fragmentation); no-op off CUDA."""
    if is_cuda_available():
        torch.cuda.memory._set_allocator_settings(f"expandable_segments:{bool(enable)}")


def auto_set_device(config: Any) -> None:
    """veRL's accelerator default: on an Ascend NPU, ``trainer.device`` becomes ``npu`` unless it is ``cpu``.
    Anywhere else (CPU, CUDA) the config is left as it is."""
    trainer = getattr(config, "trainer", None) if config is not None else None
    if trainer is None or not hasattr(trainer, "device") or not is_npu_available():
        return
    if trainer.device not in ("cpu", "npu"):
        logger.warning("trainer.device=%s on an Ascend NPU: set to npu", trainer.device)
        trainer.device = "npu"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 matmuls natively (oneDNN's bf16 path: AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch built without oneDNN
        return False


_bf16_warned: set[str] = set()


def warn_if_bf16_is_emulated(dtype: torch.dtype, device: torch.device | str, what: str) -> bool:
    """Log a warning, once per ``what`` and process, when ``what`` computes in bf16 on a CPU without native bf16:
    there every bf16 matmul converts to fp32 and back, so bf16 is slower than fp32 (SmolLM2-135M's decode step,
    batch 16, on a 2-core AVX2 machine: 310 ms in bf16 against 143 ms in fp32). Returns whether it warned."""
    if dtype != torch.bfloat16 or torch.device(device).type != "cpu" or cpu_has_native_bf16() or what in _bf16_warned:
        return False
    _bf16_warned.add(what)
    logger.warning(
        "%s computes in bfloat16 on a CPU without native bf16 (%s, no AVX512-BF16/AMX): bf16 is emulated there and "
        "slower than float32; float32 is the faster choice on this machine",
        what,
        torch.backends.cpu.get_cpu_capability(),
    )
    return True
