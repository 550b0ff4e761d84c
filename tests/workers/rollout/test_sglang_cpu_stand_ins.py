"""The import-only CPU stand-ins of tests/sglang_cpu (SGLang's kernel package and torchvision): every name raises when
called, naming itself, and the kernel stand-in refuses to load where CUDA is available (CUDA faked: this machine has
none). Loaded under other module names, so this process's imports are not touched."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

STAND_INS = Path(__file__).resolve().parents[2] / "sglang_cpu"


def load(package: str, alias: str):
    spec = importlib.util.spec_from_file_location(alias, STAND_INS / package / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[alias]
        raise
    return module


def test_the_kernel_stand_in_raises_when_called_and_refuses_cuda(monkeypatch):
    kernel = load("sgl_kernel", "verl_test_sgl_kernel")
    assert kernel.__verl_cpu_stand_in__ is True
    with pytest.raises(NotImplementedError, match="sgl_kernel.silu_and_mul was called, but this is the CPU stand-in"):
        kernel.silu_and_mul(torch.zeros(2))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ImportError, match="refuses to load where CUDA is available: install the real sglang-kernel"):
        load("sgl_kernel", "verl_test_sgl_kernel_on_cuda")


def test_the_torchvision_stand_in_imports_any_module_and_raises_when_called():
    vision = load("torchvision", "verl_test_torchvision")
    transforms = importlib.import_module("verl_test_torchvision.transforms")
    assert transforms.InterpolationMode.BICUBIC.value == "bicubic"  # a real enum: module-level tables key on it
    io = importlib.import_module("verl_test_torchvision.io")
    with pytest.raises(NotImplementedError, match="verl_test_torchvision.io.decode_image was called"):
        io.decode_image(b"")
    assert "stand-in" in repr(vision.ops.nms)
