"""An import-only CPU stand-in for ``sgl_kernel`` (tests only; see tests/sglang_cpu/README.md).

Every attribute is a function that raises when called, so an op that a model really needs fails loudly.
"""

from __future__ import annotations

import torch

__verl_cpu_stand_in__ = True
__version__ = "0.0.0+verl-cpu-stand-in"

if torch.cuda.is_available():
    raise ImportError(
        "tests/sglang_cpu/sgl_kernel is a CPU stand-in for SGLang's kernel package and refuses to load where CUDA is "
        "available: install the real sglang-kernel and take tests/sglang_cpu off PYTHONPATH"
    )


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} was called, but this is the CPU stand-in (tests/sglang_cpu), which has no kernels: "
            "this model or setting needs SGLang's CUDA kernel package"
        )

    unavailable.__name__ = name
    return unavailable
