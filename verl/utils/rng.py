"""The process-global random states (python, numpy, torch CPU, CUDA) as one picklable dict, for checkpoints."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

__all__ = ["get_rng_state", "preserve_process_state", "set_rng_state"]

logger = logging.getLogger(__name__)


def get_rng_state() -> dict[str, Any]:
    """``{"python", "numpy", "torch", "cuda"}``: the states of every global generator of this process (``cuda`` is
    None without a CUDA device)."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` returned. CUDA states are restored when both sides have the same number
    of devices; otherwise they are left as they are, with a warning."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            logger.warning("CUDA RNG states of %d devices not restored on %d", len(cuda), torch.cuda.device_count())


@contextlib.contextmanager
def preserve_process_state() -> Iterator[None]:
    """Restore the global RNG states, the torch thread count, ``torch.set_num_threads`` and multiprocessing's start
    method on exit: what starting an inference engine in this process (vLLM, SGLang) changes and a reproducible
    trainer must keep."""
    rng_state = get_rng_state()
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    start_method = multiprocessing.get_start_method(allow_none=True)
    try:
        yield
    finally:
        set_rng_state(rng_state)
        torch.set_num_threads = set_num_threads
        torch.set_num_threads(threads)
        if multiprocessing.get_start_method(allow_none=True) != start_method:
            multiprocessing.set_start_method(start_method, force=True)
