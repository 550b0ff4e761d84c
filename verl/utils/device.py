"""Which device and collective backend this process uses: CUDA + nccl when a GPU is visible, else CPU + gloo."""

from __future__ import annotations

import torch

__all__ = ["get_device_name", "get_nccl_backend", "get_torch_device", "is_cuda_available"]


def is_cuda_available() -> bool:
    """True when torch sees a CUDA device."""
    return torch.cuda.is_available()


def get_device_name() -> str:
    """``"cuda"`` when a CUDA device is visible, else ``"cpu"``."""
    return "cuda" if is_cuda_available() else "cpu"


def get_torch_device():
    """The ``torch.cuda`` module on GPU machines, else ``torch.cpu``."""
    return getattr(torch, get_device_name())


def get_nccl_backend() -> str:
    """The torch.distributed backend for this device: ``"nccl"`` on CUDA, ``"gloo"`` on CPU."""
    return "nccl" if is_cuda_available() else "gloo"
