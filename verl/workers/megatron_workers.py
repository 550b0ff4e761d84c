"""veRL's ``verl.workers.megatron_workers``: the worker classes a recipe imports when ``strategy=megatron``.

Here one set of worker classes serves every strategy (the role's ``strategy`` picks its engine, batch layout and
actor / critic class: `verl.workers.role_engines`), so these are `verl.workers.fsdp_workers`' classes under the
module path veRL's Megatron recipes import.
"""

from verl.workers.fsdp_workers import (
    ActorRolloutRefWorker,
    AsyncActorRolloutRefWorker,
    CriticWorker,
    RewardModelWorker,
)

__all__ = ["ActorRolloutRefWorker", "AsyncActorRolloutRefWorker", "CriticWorker", "RewardModelWorker"]
