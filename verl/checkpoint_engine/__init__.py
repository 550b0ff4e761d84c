"""Weight sync trainer → rollout engine (``rollout.checkpoint_engine.backend``): ``naive`` (in-process), ``shm``
(into an engine of another process of the node, through shared memory) and ``gloo`` / ``nccl`` (broadcast to rollout
replicas in other processes or on other nodes, over a process group of the push's own); the driver's side of a push is
:mod:`verl.checkpoint_engine.manager` (veRL 0.10's ``CheckpointEngineManager``)."""

from verl.checkpoint_engine import collective, shm  # noqa: F401  (register the "gloo" / "nccl" and "shm" backends)
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    ColocatedCheckpointEngine,
    WeightSyncError,
    get_checkpoint_engine,
    register_checkpoint_engine,
    tensor_digest,
)
from verl.checkpoint_engine.manager import CheckpointEngineManager, push_weights

__all__ = [
    "CheckpointEngine",
    "CheckpointEngineManager",
    "CheckpointEngineRegistry",
    "ColocatedCheckpointEngine",
    "WeightSyncError",
    "get_checkpoint_engine",
    "register_checkpoint_engine",
    "push_weights",
    "tensor_digest",
]
