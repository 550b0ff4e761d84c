"""What a role's ``strategy`` selects in a worker: its engine block, how the batch is laid out over the ranks, and
the actor / critic class that steps through the engine.

* ``fsdp`` / ``fsdp2``: the ``fsdp_config`` block (the critic's ``fsdp`` or ``model.fsdp_config``), every rank its
  own data-parallel rank, `DataParallelPPOActor` / `DataParallelPPOCritic`.
* ``megatron``: the ``megatron`` block; ranks laid out as Megatron lays them out (tensor-parallel ranks adjacent,
  then data, then pipeline: each data-parallel rank's shard goes to all its tensor and pipeline ranks, tp rank 0 of
  the last stage returns the result); `MegatronPPOActor` / `MegatronPPOCritic`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["actor_class", "critic_class", "data_parallel_layout", "engine_block"]


def engine_block(config: Any) -> Any:
    """The engine block of a typed role config (actor, ref or critic)."""
    if config.strategy == "megatron":
        return config.megatron
    return config.fsdp_engine if hasattr(config, "fsdp_engine") else config.fsdp_config


def data_parallel_layout(section: Any, rank: int, world_size: int) -> tuple[int, bool, int]:
    """``(dp_rank, is_collect, dp_size)`` of ``rank`` for a role whose raw config ``section`` (a mapping with
    ``strategy`` and, for Megatron, ``megatron``) is given."""
    if section is None or section.get("strategy", "fsdp") != "megatron":
        return rank, True, world_size
    from verl.workers.engine.megatron_setup import megatron_rank_layout

    block = section.get("megatron") or {}
    tp = int(block.get("tensor_model_parallel_size", 1) or 1)
    pp = int(block.get("pipeline_model_parallel_size", 1) or 1)
    tp_rank, dp_rank, pp_rank, dp_size = megatron_rank_layout(rank, world_size, tp, pp)
    return dp_rank, tp_rank == 0 and pp_rank == pp - 1, dp_size


def actor_class(strategy: str) -> type:
    """The actor (policy or reference) class that steps through the engine ``strategy`` builds."""
    if strategy == "megatron":
        from verl.workers.actor.megatron_actor import MegatronPPOActor

        return MegatronPPOActor
    from verl.workers.actor import DataParallelPPOActor

    return DataParallelPPOActor


def critic_class(strategy: str) -> type:
    """The critic class that steps through the engine ``strategy`` builds."""
    if strategy == "megatron":
        from verl.workers.critic.megatron_critic import MegatronPPOCritic

        return MegatronPPOCritic
    from verl.workers.critic import DataParallelPPOCritic

    return DataParallelPPOCritic
