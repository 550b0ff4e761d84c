"""Start-up checks of the model engine (``model_engine``: ``dp`` or ``megatron``) and the roles' data-parallel sizes.

A Megatron role splits ``trainer.n_gpus_per_node × nnodes`` ranks into tensor × pipeline × data parallel groups: its
batch-size checks use its data-parallel size, not the rank count.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_model_engine", "role_dp_size"]

MODEL_ENGINES = ("dp", "megatron")


def _layout_dp_size(section: Any, workers: int) -> int:
    from verl.workers.role_engines import data_parallel_layout

    return data_parallel_layout(section, 0, workers)[2]


def role_dp_size(section: Any, workers: int) -> int:
    """The data-parallel size of a role (its raw config ``section``) over ``workers`` ranks; ``workers`` when its
    layout does not split them (:func:`check_model_engine` reports that)."""
    try:
        return _layout_dp_size(section, workers)
    except ValueError:
        return workers


def check_model_engine(config: Any, workers: int, problems: list[str]) -> None:
    """``model_engine`` is one we have, the actor's strategy is the one it selects, and each Megatron role's
    tensor × pipeline sizes divide the ranks."""
    engine = config.get("model_engine", "dp")
    if engine not in MODEL_ENGINES:
        problems.append(f"model_engine={engine!r}: the {engine} engine is not available here; use dp or megatron")
    for name, section in (("actor_rollout_ref.actor", config.actor_rollout_ref.actor), ("critic", config.critic)):
        if section.get("strategy") == "megatron":
            try:
                _layout_dp_size(section, workers)
            except ValueError as error:
                problems.append(f"{name}.megatron: {error}")
    strategy = config.actor_rollout_ref.actor.get("strategy", "fsdp")
    if (engine == "megatron") != (strategy == "megatron"):
        problems.append(
            f"model_engine={engine!r} with actor_rollout_ref.actor.strategy={strategy!r}: the model engine selects "
            "the roles' configs (model_engine=megatron: megatron_actor / megatron_ref / megatron_critic)"
        )
