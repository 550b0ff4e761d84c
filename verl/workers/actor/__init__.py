"""Policy actors: `DataParallelPPOActor` (FSDP)."""

from verl.workers.actor.dp_actor import DataParallelPPOActor

__all__ = ["DataParallelPPOActor"]
