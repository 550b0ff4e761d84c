"""Weight sync trainer → rollout engine (``rollout.checkpoint_engine.backend``); ``naive`` is colocated."""

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
