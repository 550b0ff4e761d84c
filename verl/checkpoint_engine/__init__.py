"""Weight sync trainer → rollout engine (``rollout.checkpoint_engine.backend``): ``naive`` (in-process) and ``shm``
(into an engine of another process of the node, through shared memory)."""

from verl.checkpoint_engine import shm  # noqa: F401  (registers the "shm" backend)
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    ColocatedCheckpointEngine,
    WeightSyncError,
    get_checkpoint_engine,
    register_checkpoint_engine,
    tensor_digest,
)

__all__ = [
    "CheckpointEngine",
    "CheckpointEngineRegistry",
    "ColocatedCheckpointEngine",
    "WeightSyncError",
    "get_checkpoint_engine",
    "register_checkpoint_engine",
    "tensor_digest",
]
