"""Process-group set-up inside a worker (the worker group has set RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from verl.utils.device import get_nccl_backend

__all__ = ["destroy_global_process_group", "initialize_global_process_group"]


def initialize_global_process_group(timeout_second: int = 600, backend: str | None = None) -> tuple[int, int, int]:
    """Join the default process group (gloo on CPU, nccl on GPU) once; returns ``(rank, local_rank, world_size)``."""
    if not dist.is_initialized():
        dist.init_process_group(
            backend=backend or get_nccl_backend(), timeout=datetime.timedelta(seconds=timeout_second)
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % max(torch.cuda.device_count(), 1))
    return dist.get_rank(), local_rank, dist.get_world_size()


def destroy_global_process_group() -> None:
    """Leave the default process group if this process is in one."""
    if dist.is_initialized():
        dist.destroy_process_group()
