"""Sharded checkpoints of an FSDP2 model and its optimizer with ``torch.distributed.checkpoint`` (DCP).

Layout of a checkpoint folder::

    <path>/.metadata           DCP index (which tensor slice is in which file)
    <path>/__<rank>_0.distcp   each rank's shards of the model and optimizer state
    <path>/extra_state.pt      rank 0: lr-scheduler state and the world size that wrote it
    <path>/rng_rank_<r>.pt     each rank's python / numpy / torch / CUDA random states

DCP stores global tensor metadata, so a checkpoint written by W ranks loads into any number of ranks (the random
states are then not restored: they belong to ranks that no longer exist). All ranks must call ``save_sharded`` /
``load_sharded`` together; ``read_extra_state`` checks every file first, so a missing or damaged file is reported
the same way on every rank before any collective starts.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist

from verl.utils.checkpoint.checkpoint_manager import load_state_file, save_state_file
from verl.utils.rng import get_rng_state, set_rng_state

__all__ = [
    "EXTRA_STATE_FILE",
    "METADATA_FILE",
    "check_checkpoint_files",
    "has_optimizer_state",
    "load_rng_state",
    "load_sharded",
    "read_extra_state",
    "rng_file",
    "save_sharded",
]

logger = logging.getLogger(__name__)

METADATA_FILE = ".metadata"
EXTRA_STATE_FILE = "extra_state.pt"


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    optimizers = () if optimizer is None else (optimizer,)
    model_sd, optim_sd = get_state_dict(model, optimizers, options=StateDictOptions())
    state: dict[str, Any] = {"model": model_sd}
    if optimizer is not None:
        state["optimizer"] = optim_sd
    return state


def rng_file(path: str, rank: int) -> str:
    """The file of ``rank``'s random states in the checkpoint at ``path``."""
    return os.path.join(path, f"rng_rank_{rank}.pt")


def save_sharded(
    path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, extra_state: dict[str, Any]
) -> None:
    """Write the model (+ optimizer) shards and the random states of every rank under ``path`` and, from rank 0,
    ``extra_state``."""
    import torch.distributed.checkpoint as dcp  # imported when used: ~0.7 s of a worker's start-up otherwise

    os.makedirs(path, exist_ok=True)
    dcp.save(_state(model, optimizer), checkpoint_id=path)
    save_state_file(get_rng_state(), rng_file(path, dist.get_rank()))
    if dist.get_rank() == 0:
        save_state_file({**extra_state, "world_size": dist.get_world_size()}, os.path.join(path, EXTRA_STATE_FILE))
    dist.barrier()
    logger.info("saved a sharded checkpoint to %s", path)


def check_checkpoint_files(path: str) -> None:
    """Raise FileNotFoundError naming the first missing file, or ValueError naming a truncated or unreadable one.

    Checks the folder, ``.metadata``, ``extra_state.pt`` and every data file the metadata refers to (present and
    long enough for the byte ranges it indexes). Every rank sees the same files, so every rank raises the same error.
    """
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint folder {path} does not exist")
    for name in (METADATA_FILE, EXTRA_STATE_FILE):
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise FileNotFoundError(f"checkpoint file {file} is missing (an incomplete or foreign checkpoint?)")
    from torch.distributed.checkpoint import FileSystemReader

    try:
        metadata = FileSystemReader(path).read_metadata()
    except Exception as e:  # any unpickling error means the same thing here
        raise ValueError(f"checkpoint file {os.path.join(path, METADATA_FILE)} is corrupt ({type(e).__name__})") from e
    needed: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for relative, size in sorted(needed.items()):
        file = os.path.join(path, relative)
        if not os.path.isfile(file):
            raise FileNotFoundError(f"checkpoint file {file} is missing ({METADATA_FILE} refers to it)")
        if os.path.getsize(file) < size:
            raise ValueError(
                f"checkpoint file {file} is truncated: {os.path.getsize(file)} bytes, {METADATA_FILE} indexes {size}"
            )


def read_extra_state(path: str) -> dict[str, Any]:
    """Check the checkpoint's files (``check_checkpoint_files`` and every rank's random-state file) and return the
    extra state rank 0 saved."""
    check_checkpoint_files(path)
    extra = load_state_file(os.path.join(path, EXTRA_STATE_FILE), weights_only=True)
    for rank in range(int(extra.get("world_size", 0))):
        if not os.path.isfile(rng_file(path, rank)):
            raise FileNotFoundError(f"checkpoint file {rng_file(path, rank)} is missing (rank {rank}'s random states)")
    return extra


def load_rng_state(path: str, saved_world_size: int) -> bool:
    """Restore this rank's random states from the checkpoint when it was written by as many ranks as there are now;
    returns whether they were restored."""
    if saved_world_size != dist.get_world_size():
        logger.warning(
            "random states of %s not restored: written by %d ranks, loaded by %d",
            path,
            saved_world_size,
            dist.get_world_size(),
        )
        return False
    set_rng_state(load_state_file(rng_file(path, dist.get_rank())))
    return True


def load_sharded(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Load the model (+ optimizer) shards saved by ``save_sharded`` into ``model``/``optimizer``, resharding to
    the current world size if needed. Call ``read_extra_state`` first: it checks the files."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = _state(model, optimizer)
    try:
        dcp.load(state, checkpoint_id=path)
    except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
        raise RuntimeError(f"cannot load the sharded checkpoint in {path}: {_first_failure(e)}") from e
    set_state_dict(
        model,
        () if optimizer is None else (optimizer,),
        model_state_dict=state["model"],
        optim_state_dict=state.get("optimizer", {}),
        options=StateDictOptions(),
    )


def _first_failure(error: BaseException) -> str:
    """The first rank's own error inside a DCP ``CheckpointException`` (whose text holds every rank's traceback)."""
    from torch.distributed.checkpoint.api import CheckpointException

    failures = getattr(error, "failures", None)
    if isinstance(error, CheckpointException) and failures:
        rank, (exc, _) = next(iter(sorted(failures.items(), key=lambda item: item[0])))
        return f"rank {rank}: {type(exc).__name__}: {exc}"
    return f"{type(error).__name__}: {error}"


def has_optimizer_state(path: str) -> bool:
    """Whether the checkpoint at ``path`` holds optimizer state (a forward-only engine saves none)."""
    from torch.distributed.checkpoint import FileSystemReader

    keys = FileSystemReader(path).read_metadata().state_dict_metadata
    return any(key.startswith("optimizer.") for key in keys)
