"""The trainer's worker groups: the resource pools, and one fused worker per bundle for the roles of each pool."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup, create_colocated_worker_cls
from verl.trainer.ppo.utils import Role, check_ref_worker

__all__ = ["spawn_worker_groups"]


def spawn_worker_groups(
    resource_pool_manager: Any,
    role_worker_mapping: dict[Role, Any],
    config: Any,
    *,
    roles: dict[str, bool],
    resident: bool,
    separate: bool,
    trainer_engines: bool = False,
    extra_per_bundle: int = 0,
    worker_group_cls: type = RayWorkerGroup,
) -> tuple[dict[str, RayWorkerGroup], Role]:
    """Create the pools and spawn the groups (models not built yet): ``actor_rollout`` (role ``actor_rollout`` /
    ``actor``, ``_ref`` when ``roles["ref"]``: the reference policy runs in the actor's workers), and ``critic`` /
    ``rm`` when ``roles`` says they run. ``resident``: the rollout engines are servers of their own (the training
    workers are role ``actor``), beside them on each bundle unless ``separate`` (a pool of their own);
    ``trainer_engines``: the training workers hold an engine too (role ``actor_rollout``: the hybrid switch lends it);
    ``extra_per_bundle``: processes of other groups that will share each bundle (a colocated judge's servers).
    Returns the groups by name and the actor's :class:`Role`."""
    per_bundle = 1 + int(resident and not separate) + extra_per_bundle  # e.g. a training worker and its server
    if per_bundle > 1:
        resource_pool_manager.max_colocate_count = max(per_bundle, resource_pool_manager.max_colocate_count)
    resource_pool_manager.create_resource_pool()
    pool_classes: dict[Any, dict[str, RayClassWithInitArgs]] = defaultdict(dict)
    arr_role = Role.ActorRolloutRef if Role.ActorRolloutRef in role_worker_mapping else Role.ActorRollout
    check_ref_worker(role_worker_mapping, arr_role)
    pool = resource_pool_manager.get_resource_pool(arr_role)
    role_name = ("actor" if resident and not trainer_engines else "actor_rollout") + (
        "_ref" if roles.get("ref") else ""
    )
    distillation = config.get("distillation") or {}
    # veRL 0.10's argument, given only when distilling (a recipe's worker class need not know it)
    extra = {"distillation_config": distillation} if distillation.get("enabled", False) else {}
    pool_classes[pool]["actor_rollout"] = RayClassWithInitArgs(
        role_worker_mapping[arr_role], config=config.actor_rollout_ref, role=role_name, **extra
    )
    for name, role, section in (("critic", Role.Critic, "critic"), ("rm", Role.RewardModel, "reward_model")):
        if roles.get(name):
            pool = resource_pool_manager.get_resource_pool(role)
            pool_classes[pool][name] = RayClassWithInitArgs(role_worker_mapping[role], config=config[section])
    groups: dict[str, RayWorkerGroup] = {}
    for pool, class_dict in pool_classes.items():
        fused = create_colocated_worker_cls(class_dict)
        wg = worker_group_cls(pool, fused, name_prefix=f"{pool.name_prefix}_")
        groups.update(wg.spawn(class_dict.keys()))
    return groups, arr_role
