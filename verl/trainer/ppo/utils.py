"""Driver-side pieces of the PPO trainer that are not stages: roles, resource pools, and the advantage / KL-reward
computations done on the driver (veRL exposes them from ``verl.trainer.ppo.ray_trainer``)."""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch

from verl.protocol import DataProto
from verl.single_controller.ray import RayResourcePool
from verl.trainer.config.algorithm import SUM_PI_SQUARED_ESTIMATORS
from verl.trainer.config.validate import need_critic, need_reference_policy
from verl.trainer.ppo.core_algos import AdvantageEstimator, get_adv_estimator_fn, kl_penalty
from verl.utils.torch_functional import masked_mean

__all__ = [
    "ResourcePoolManager",
    "Role",
    "apply_kl_penalty",
    "compute_advantage",
    "need_critic",
    "need_reference_policy",
]


class Role(Enum):
    """The roles a worker can play (``str(role)`` gives veRL's role strings)."""

    Actor = 0
    Rollout = 1
    ActorRollout = 2
    Critic = 3
    RefPolicy = 4
    RewardModel = 5
    ActorRolloutRef = 6

    def __str__(self) -> str:
        return {
            "Actor": "actor",
            "Rollout": "rollout",
            "ActorRollout": "actor_rollout",
            "Critic": "critic",
            "RefPolicy": "ref",
            "RewardModel": "rm",
            "ActorRolloutRef": "actor_rollout_ref",
        }[self.name]


class ResourcePoolManager:
    """Named resource pools (``{"global_pool": [procs per node, ...]}``) and which role runs in which pool."""

    def __init__(
        self,
        resource_pool_spec: dict[str, list[int]],
        mapping: dict[Role, str],
        max_colocate_count: int = 1,
        use_gpu: bool = True,
    ) -> None:
        self.resource_pool_spec = resource_pool_spec
        self.mapping = mapping
        self.max_colocate_count = max_colocate_count
        self.use_gpu = use_gpu
        self.resource_pool_dict: dict[str, RayResourcePool] = {}

    def create_resource_pool(self) -> None:
        """One `RayResourcePool` per spec entry (GPU bundles when ``use_gpu`` and the cluster has GPUs, CPU bundles
        otherwise: ``trainer.device=cpu`` keeps the workers off the GPUs)."""
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = RayResourcePool(
                process_on_nodes=process_on_nodes,
                use_gpu=self.use_gpu,
                max_colocate_count=self.max_colocate_count,
                name_prefix=name,
            )

    def get_resource_pool(self, role: Role) -> RayResourcePool:
        return self.resource_pool_dict[self.mapping[role]]

    def get_n_gpus(self) -> int:
        """Worker processes across all pools."""
        return sum(sum(nodes) for nodes in self.resource_pool_spec.values())


def apply_kl_penalty(data: DataProto, kl_ctrl: Any, kl_penalty_type: str = "kl") -> tuple[DataProto, dict]:
    """``token_level_rewards = token_level_scores − β·KL(π_old ‖ π_ref)`` per token; updates an adaptive β.

    Returns the data and ``actor/reward_kl_penalty`` / ``actor/reward_kl_penalty_coeff``.
    """
    b = data.batch
    mask = b["response_mask"]
    kld = kl_penalty(b["old_log_probs"], b["ref_log_prob"], kl_penalty=kl_penalty_type) * mask
    beta = kl_ctrl.value
    b["token_level_rewards"] = b["token_level_scores"] - beta * kld
    current_kl = float(torch.mean(masked_mean(kld, mask, axis=-1)))
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_advantage(
    data: DataProto,
    adv_estimator: str,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> DataProto:
    """``advantages`` and ``returns`` by the registered estimator ``adv_estimator`` (on the driver)."""
    b = data.batch
    if adv_estimator == AdvantageEstimator.GAE.value or adv_estimator == AdvantageEstimator.GAE:
        advantages, returns = get_adv_estimator_fn(adv_estimator)(
            token_level_rewards=b["token_level_rewards"],
            values=b["values"],
            response_mask=b["response_mask"],
            gamma=gamma,
            lam=lam,
        )
    else:
        kwargs: dict[str, Any] = {}
        # the inputs only some estimators take (ReMax's baseline; the optimal-token baselines' policy statistics)
        for key in ("reward_baselines", "old_log_probs", "sum_pi_squared", "rollout_is_weights"):
            if key in b.keys() and (key == "reward_baselines" or adv_estimator in SUM_PI_SQUARED_ESTIMATORS):
                kwargs[key] = b[key]
        advantages, returns = get_adv_estimator_fn(adv_estimator)(
            token_level_rewards=b["token_level_rewards"],
            response_mask=b["response_mask"],
            index=data.non_tensor_batch["uid"],
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            gamma=gamma,
            config=config,
            **kwargs,
        )
    b["advantages"], b["returns"] = advantages, returns
    return data
