"""Servers of a model whose weights are its path's and never pushed: a served reward model's replicas
(`verl.experimental.reward_loop`) and a distillation teacher's (`verl.experimental.teacher_loop`).

:func:`served_model_worker_config` is their worker config (the policy's rollout settings under the model's own);
:func:`start_model_servers` starts one server per bundle of a pool and returns the worker group and a
:class:`~verl.experimental.agent_loop.server_manager.ServerHandle` per replica, named ``<name> rank <r>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import OmegaConf

__all__ = ["served_model_worker_config", "start_model_servers"]


def served_model_worker_config(config: Any, model_path: str, rollout: Mapping[str, Any] | None) -> Any:
    """``{model, rollout}`` of a server of ``model_path``: the policy's ``actor_rollout_ref.rollout`` settings with
    ``rollout`` over them (one response per request), and the policy's ``trust_remote_code``."""
    policy = config.actor_rollout_ref
    resolved = OmegaConf.to_container(policy.rollout, resolve=True)  # its interpolations point into the config
    own = OmegaConf.to_container(rollout, resolve=True) if OmegaConf.is_config(rollout) else dict(rollout or {})
    merged = OmegaConf.merge(resolved, own)
    merged.n = 1
    model = {"path": model_path, "trust_remote_code": bool(policy.model.get("trust_remote_code", False))}
    return OmegaConf.create({"model": model, "rollout": merged})


def start_model_servers(
    resource_pool: Any, worker_config: Any, name: str, server_cls: Any = None, role: str = "rollout"
) -> tuple[Any, list[Any]]:
    """One server per bundle of ``resource_pool`` (``server_cls``, default a rollout server whose weights come from
    its path and are reloaded after a sleep), models built; returns the worker group and the replicas' handles."""
    from verl.experimental.agent_loop.server_manager import ServerHandle
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
    from verl.single_controller.ray.colocated import remote_worker_class
    from verl.workers.rollout_worker import RolloutServerWorker

    extra = {"weights_from_path": True} if server_cls is None else {}
    cls = RayClassWithInitArgs(
        remote_worker_class(server_cls or RolloutServerWorker), config=worker_config, role=role, **extra
    )
    group = RayWorkerGroup(resource_pool, cls, name_prefix=f"{name}_")
    group.init_model()
    prefix = getattr(group, "method_prefix", "")
    handles = [ServerHandle(worker, prefix, name=f"{name} rank {rank}") for rank, worker in enumerate(group.workers)]
    return group, handles
