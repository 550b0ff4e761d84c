"""Spawning a real gloo process group of N ranks on this machine for a test (torch.multiprocessing)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from verl.utils.distributed import destroy_global_process_group, initialize_global_process_group


def free_port() -> int:
    """A TCP port nobody listens on right now (for MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable[..., Any], args: tuple) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank)
    )
    torch.set_num_threads(1)
    initialize_global_process_group(timeout_second=120)
    try:
        fn(rank, *args)
    finally:
        destroy_global_process_group()


def spawn_gloo(fn: Callable[..., Any], world: int, *args: Any) -> None:
    """Run ``fn(rank, *args)`` on ``world`` processes joined in the default process group (gloo on CPU); an error
    on any rank is raised here. ``fn`` must be importable (a module-level function)."""
    mp.spawn(_entry, args=(world, free_port(), fn, args), nprocs=world, join=True)
