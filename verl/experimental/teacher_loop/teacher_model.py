"""On-policy distillation's teachers as servers (veRL 0.10's ``MultiTeacherModelManager``): each teacher of
``distillation.teacher_models`` gets its share of the teacher pool (``num_replicas`` replicas, one server each,
behind our request API), and :meth:`MultiTeacherModelManager.get_client` gives one client per teacher key.

A teacher's server is a rollout server of its ``model_path`` (weights never pushed) with the student's rollout
settings under its ``inference.*``, sized for scoring: its prompt is the student's prompt and response together and it
generates one token; it answers ``prompt_logprobs`` requests
(:class:`~verl.experimental.teacher_loop.teacher_manager.AsyncTeacherLLMServerManager`).
"""

from __future__ import annotations

import logging
from typing import Any

from verl.experimental.served_model import served_model_worker_config, start_model_servers
from verl.workers.config.distillation import DistillationConfig, DistillationTeacherModelConfig

__all__ = ["MultiTeacherModelManager", "teacher_worker_config"]

logger = logging.getLogger(__name__)

SERVING_ENGINES = ("hf", "vllm")  # engines that answer prompt_logprobs


def teacher_worker_config(config: Any, teacher: DistillationTeacherModelConfig, topk: int = 0) -> Any:
    """The worker config of ``teacher``'s servers (see the module docstring); a vLLM teacher is started with
    ``max_logprobs`` of at least ``topk`` (veRL's rule: its own default caps the top-k a request may ask)."""
    student = config.actor_rollout_ref.rollout
    scoring = {
        **teacher.inference,
        "prompt_length": int(student.prompt_length) + int(student.response_length),
        "response_length": 1,
        "temperature": 1.0,  # log-probs of given tokens: no sampling
    }
    worker = served_model_worker_config(config, teacher.model_path, scoring)
    where = f"distillation.teacher_models[{teacher.key!r}]"
    if worker.rollout.name not in SERVING_ENGINES:
        raise ValueError(
            f"{where}.inference.name={worker.rollout.name!r}: a teacher's prompt log-probs are served by "
            f"{list(SERVING_ENGINES)} so far"
        )
    if worker.rollout.name == "vllm" and topk:
        vllm = dict(worker.rollout.engine_kwargs.get("vllm") or {})
        vllm["max_logprobs"] = max(int(vllm.get("max_logprobs") or 0), topk)
        worker.rollout.engine_kwargs.vllm = vllm
    if teacher.per_replica_world_size != 1:
        raise ValueError(f"{where}: one replica per device (tensor, data and pipeline parallel sizes 1) so far")
    return worker


class MultiTeacherModelManager:
    """The teachers' replicas on ``resource_pool`` (split in ``distillation.teacher_models`` order, each teacher its
    ``num_replicas``).

    Args:
        config: the trainer config (``distillation`` enabled, ``actor_rollout_ref.rollout``).
        resource_pool: the teacher pool (``distillation.n_gpus_per_node × nnodes`` bundles).
    """

    def __init__(self, config: Any, resource_pool: Any) -> None:
        from verl.single_controller.ray.base import split_resource_pool

        self.distillation_config = DistillationConfig.from_config(config.distillation)
        teachers = self.distillation_config.teacher_models
        k = self.distillation_config.distillation_loss.teacher_logprobs_k
        workers = {key: teacher_worker_config(config, teacher, k) for key, teacher in teachers.items()}
        sizes = [t.num_replicas * t.per_replica_world_size for t in teachers.values()]
        pools = split_resource_pool(resource_pool, sizes) if len(sizes) > 1 else [resource_pool]
        self.worker_groups: dict[str, Any] = {}
        self.server_handles: dict[str, list[Any]] = {}
        for (key, teacher), pool in zip(teachers.items(), pools, strict=True):
            group, handles = start_model_servers(pool, workers[key], f"teacher_{key}")
            self.worker_groups[key], self.server_handles[key] = group, handles
            logger.info("teacher %r: %s, %d replica(s)", key, teacher.model_path, len(handles))

    def get_client(self) -> dict[str, Any]:
        """One client per teacher key (requests spread over that teacher's replicas)."""
        from verl.experimental.agent_loop.server_manager import AsyncLLMServerManager

        return {key: AsyncLLMServerManager(None, handles) for key, handles in self.server_handles.items()}

    def shutdown(self) -> None:
        """Stop every teacher's servers."""
        for group in self.worker_groups.values():
            group.shutdown()
