"""Spawning a real gloo process group of N ranks on this machine for a test (torch.multiprocessing).

The ranks meet through a file in a fresh temporary folder (``file://`` rendezvous), not a TCP port picked in advance:
a port found free and released could be taken by another process before rank 0 listens on it."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp

from verl.utils.distributed import destroy_global_process_group, initialize_global_process_group


def file_init_method(folder: str) -> str:
    """A ``file://`` rendezvous for one process group: every rank of the group passes the same string, and no other
    group uses the file (``folder`` is a fresh temporary folder)."""
    return f"file://{os.path.join(os.path.abspath(folder), 'pg')}"


def _entry(rank: int, world: int, init_method: str, fn: Callable[..., Any], args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    initialize_global_process_group(timeout_second=120, init_method=init_method)
    try:
        fn(rank, *args)
    finally:
        destroy_global_process_group()


def spawn_gloo(fn: Callable[..., Any], world: int, *args: Any) -> None:
    """Run ``fn(rank, *args)`` on ``world`` processes joined in the default process group (gloo on CPU); an error
    on any rank is raised here. ``fn`` must be importable (a module-level function). Each call rendezvouses through
    its own new file."""
    with tempfile.TemporaryDirectory(prefix="verl-pg-") as folder:
        mp.spawn(_entry, args=(world, file_init_method(folder), fn, args), nprocs=world, join=True)
