"""Driver-side pieces of the PPO trainer that are not stages: roles, resource pools, and the advantage / KL-reward
computations done on the driver (veRL exposes them from ``verl.trainer.ppo.ray_trainer``)."""

from __future__ import annotations

from enum import Enum
from typing import Any

import torch

from verl.protocol import DataProto
from verl.single_controller.ray import RayResourcePool
from verl.trainer.config import validate
from verl.trainer.config.validate import need_critic
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.core_algos import kl_penalty as kl_penalty_fn
from verl.utils.py_functional import accepted_kwargs
from verl.utils.torch_functional import masked_mean

#: veRL's annotation for the worker classes in ``role_worker_mapping``
WorkerType = type

__all__ = [
    "ResourcePoolManager",
    "Role",
    "WorkerType",
    "apply_kl_penalty",
    "check_ref_worker",
    "compute_advantage",
    "compute_response_mask",
    "need_critic",
    "need_reference_policy",
    "need_reward_model",
    "need_teacher_policy",
]  # and create_rl_dataset / create_rl_sampler (veRL 0.10's home of them; imported on first use)

_DATASET_EXPORTS = ("create_rl_dataset", "create_rl_sampler")


def __getattr__(name: str) -> Any:
    """``create_rl_dataset`` / ``create_rl_sampler`` of `verl.utils.dataset.rl_dataset` (veRL 0.10 moved them
    here), imported on first use."""
    if name in _DATASET_EXPORTS:
        from verl.utils.dataset import rl_dataset

        return getattr(rl_dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Role(Enum):
    """The roles a worker can play (``str(role)`` gives veRL's role strings)."""

    Actor = 0
    Rollout = 1
    ActorRollout = 2
    Critic = 3
    RefPolicy = 4
    RewardModel = 5
    ActorRolloutRef = 6
    TeacherModel = 7

    def __str__(self) -> str:
        return {
            "Actor": "actor",
            "Rollout": "rollout",
            "ActorRollout": "actor_rollout",
            "Critic": "critic",
            "RefPolicy": "ref",
            "RewardModel": "rm",
            "ActorRolloutRef": "actor_rollout_ref",
            "TeacherModel": "teacher",
        }[self.name]


class ResourcePoolManager:
    """Named resource pools (``{"global_pool": [procs per node, ...]}``) and which role runs in which pool."""

    def __init__(
        self,
        resource_pool_spec: dict[str, list[int]],
        mapping: dict[Role, str],
        max_colocate_count: int = 1,
        use_gpu: bool = True,
        custom_resources: dict[str, dict[str, float]] | None = None,
    ) -> None:
        self.resource_pool_spec = resource_pool_spec
        self.mapping = mapping
        self.max_colocate_count = max_colocate_count
        self.use_gpu = use_gpu
        self.custom_resources = dict(custom_resources or {})  # pool name → Ray custom resources per bundle
        self.resource_pool_dict: dict[str, RayResourcePool] = {}

    def create_resource_pool(self) -> None:
        """One `RayResourcePool` per spec entry (GPU bundles when ``use_gpu`` and the cluster has GPUs, CPU bundles
        otherwise: ``trainer.device=cpu`` keeps the workers off the GPUs), each bundle also asking for the pool's
        ``custom_resources``."""
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = RayResourcePool(
                process_on_nodes=process_on_nodes,
                use_gpu=self.use_gpu,
                max_colocate_count=self.max_colocate_count,
                name_prefix=name,
                custom_resources=self.custom_resources.get(name),
            )

    def get_resource_pool(self, role: Role) -> RayResourcePool:
        return self.resource_pool_dict[self.mapping[role]]

    def get_n_gpus(self) -> int:
        """Worker processes across all pools."""
        return sum(sum(nodes) for nodes in self.resource_pool_spec.values())


def need_reward_model(config_or_mapping: Any) -> bool:
    """Whether a reward model runs: from a ``role_worker_mapping`` (veRL's older call: ``Role.RewardModel`` is in it)
    or from a config (veRL 0.10's: ``reward.reward_model.enable``, or the legacy top-level ``reward_model.enable``)."""
    if isinstance(config_or_mapping, dict) and all(isinstance(k, Role) for k in config_or_mapping):
        return Role.RewardModel in config_or_mapping
    for section in ((config_or_mapping.get("reward") or {}).get("reward_model"), config_or_mapping.get("reward_model")):
        if section is not None and section.get("enable") is not None:
            return bool(section.get("enable"))
    return False


def need_teacher_policy(config: Any) -> bool:
    """Whether teacher models run (veRL 0.10's on-policy distillation, ``distillation.enabled``)."""
    return bool((config.get("distillation") or {}).get("enabled", False))


def need_reference_policy(config_or_mapping: Any) -> bool:
    """Whether a reference policy runs: from the config (a KL term needs it) or, as veRL's newer call, from a
    ``role_worker_mapping`` (it maps ``Role.RefPolicy`` or ``Role.ActorRolloutRef``)."""
    if isinstance(config_or_mapping, dict) and all(isinstance(k, Role) for k in config_or_mapping):
        return Role.RefPolicy in config_or_mapping or Role.ActorRolloutRef in config_or_mapping
    return validate.need_reference_policy(config_or_mapping)


def apply_kl_penalty(data: DataProto, kl_ctrl: Any, kl_penalty: str = "kl") -> tuple[DataProto, dict]:
    """``token_level_rewards = token_level_scores − β·KL(π_old ‖ π_ref)`` per token; updates an adaptive β.

    Returns the data and ``actor/reward_kl_penalty`` / ``actor/reward_kl_penalty_coeff``.
    """
    b = data.batch
    mask = b["response_mask"]
    kld = kl_penalty_fn(b["old_log_probs"], b["ref_log_prob"], kl_penalty=kl_penalty) * mask
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
    """``advantages`` and ``returns`` by the registered estimator ``adv_estimator`` (on the driver).

    The estimator gets only the keywords it declares (all with ``**kwargs``) out of: ``token_level_rewards``,
    ``response_mask``, ``index`` (the ``uid`` of each sample's prompt), ``gamma``, ``lam``,
    ``norm_adv_by_std_in_grpo``, ``config``, ``non_tensor_batch`` and ``batch`` (the data's two halves: GDPO reads
    its reward components from the first) and, when the batch has them, ``values``, ``reward_baselines``,
    ``old_log_probs``, ``sum_pi_squared`` and ``rollout_is_weights``. ``response_mask`` is derived from the
    attention mask when the batch lacks it (veRL does the same for trainers that do not compute it).
    """
    b = data.batch
    if "response_mask" not in b.keys():
        b["response_mask"] = compute_response_mask(data)
    kwargs: dict[str, Any] = {
        "token_level_rewards": b["token_level_rewards"],
        "response_mask": b["response_mask"],
        "gamma": gamma,
        "lam": lam,
        "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
        "config": config,
        "non_tensor_batch": data.non_tensor_batch,
        "batch": b,
    }
    if "uid" in data.non_tensor_batch:
        kwargs["index"] = data.non_tensor_batch["uid"]
    for key in ("values", "reward_baselines", "old_log_probs", "sum_pi_squared", "rollout_is_weights"):
        if key in b.keys():
            kwargs[key] = b[key]
    estimator = get_adv_estimator_fn(adv_estimator)
    advantages, returns = estimator(**accepted_kwargs(estimator, kwargs))
    b["advantages"], b["returns"] = advantages, returns
    return data


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """The response part of ``attention_mask``: its last ``responses.shape[-1]`` columns (veRL's helper)."""
    width = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -width:]


def check_ref_worker(role_worker_mapping: dict[Role, Any], actor_role: Role) -> None:
    """A ``Role.RefPolicy`` entry (``TaskRunner.add_ref_policy_worker``) must be the actor's worker class: the
    reference policy runs inside the actor's workers (role ``actor_rollout_ref``)."""
    ref_cls = role_worker_mapping.get(Role.RefPolicy)
    if ref_cls is None:
        return
    actor_cls = getattr(role_worker_mapping[actor_role], "__ray_actor_class__", role_worker_mapping[actor_role])
    ref_cls = getattr(ref_cls, "__ray_actor_class__", ref_cls)
    if not issubclass(actor_cls, ref_cls):
        raise TypeError(
            f"role_worker_mapping[Role.RefPolicy] = {ref_cls.__qualname__}: the reference policy runs inside the actor "
            f"workers ({actor_cls.__qualname__}, role actor_rollout_ref); a separate reference worker class is not "
            "supported — map Role.RefPolicy to the actor's class"
        )
