"""Process-group set-up inside a worker (the worker group has set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from verl.utils.device import get_nccl_backend

__all__ = ["destroy_global_process_group", "initialize_global_process_group"]


def initialize_global_process_group(
    timeout_second: int = 600, backend: str | None = None, init_method: str | None = None
) -> tuple[int, int, int]:
    """Join the default process group (gloo on CPU, nccl on GPU) once; returns ``(rank, local_rank, world_size)``.

    By default the ranks meet at ``MASTER_ADDR:MASTER_PORT`` (``env://``). ``init_method`` names another rendezvous
    (e.g. ``file:///tmp/x/pg``, a file no other group uses); the rank and world size are then read from ``RANK`` and
    ``WORLD_SIZE``."""
    if not dist.is_initialized():
        kwargs = {}
        if init_method is not None:
            kwargs = {"init_method": init_method, "rank": int(os.environ["RANK"])}
            kwargs["world_size"] = int(os.environ["WORLD_SIZE"])
        dist.init_process_group(
            backend=backend or get_nccl_backend(), timeout=datetime.timedelta(seconds=timeout_second), **kwargs
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % max(torch.cuda.device_count(), 1))
    return dist.get_rank(), local_rank, dist.get_world_size()


def destroy_global_process_group() -> None:
    """Leave the default process group if this process is in one."""
    if dist.is_initialized():
        dist.destroy_process_group()
