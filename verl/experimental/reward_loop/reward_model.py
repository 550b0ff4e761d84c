"""A served reward model (veRL 0.10's ``RewardModelManager``): replicas of the reward model behind the router.

With ``reward.reward_model.enable`` the run serves ``reward.reward_model.model_path``:

1. the router (`verl.experimental.reward_loop.router`) starts before the reward functions are built, so its
   address and the reward model's tokenizer reach them as ``reward_router_address`` / ``reward_model_tokenizer``;
2. :class:`RewardModelManager` starts one replica per bundle of the reward model's pool
   (``reward.reward_model.enable_resource_pool``) or, without one, beside each training worker
   (:func:`colocated_judge`), registered with the router: for a causal LM (a *generative* judge, which a custom
   reward function prompts) a rollout server (:class:`~verl.workers.rollout_worker.RolloutServerWorker`, engine
   ``reward.reward_model.rollout.name``, the policy's rollout settings under ``reward.reward_model.rollout.*``); for
   a classifier (a *discriminative* reward model, whose score is the reward when no custom function is given) a
   :class:`~verl.experimental.reward_loop.score_server.RewardScoreServer`.

The reward model's weights never change: nothing is pushed to these servers. Replicas beside the training workers
sleep when the policy's rollout engines do (:meth:`RewardModelManager.sleep`, called by the trainer's
``CheckpointManager``) and are woken after the next weight push; an engine that drops its weights on sleep (hf)
loads them from ``model_path`` again.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.experimental.served_model import served_model_worker_config, start_model_servers

__all__ = ["RewardModelManager", "colocated_judge", "reward_model_worker_config", "served_reward_model"]

logger = logging.getLogger(__name__)


def served_reward_model(config: Any) -> bool:
    """Whether the run serves a reward model (``reward.reward_model.enable``)."""
    reward = config.get("reward") or {}
    return bool((reward.get("reward_model") or {}).get("enable", False))


def colocated_judge(config: Any) -> bool:
    """Whether the served reward model's replicas share the training workers' bundles (no pool of its own): one
    replica beside each training worker, in a process of its own, asleep while the policy's engines are."""
    return served_reward_model(config) and not config.reward.reward_model.get("enable_resource_pool", False)


def reward_model_worker_config(config: Any) -> Any:
    """The reward model servers' worker config: ``model`` (``reward.reward_model.model_path``, the policy's
    ``trust_remote_code``) and ``rollout`` (the policy's rollout settings under ``reward.reward_model.rollout``)."""
    rm = config.reward.reward_model
    return served_model_worker_config(config, rm.model_path, rm.get("rollout"))


class RewardModelManager:
    """The reward model's replicas on ``resource_pool``, registered with ``router`` (see the module docstring).

    Args:
        config: the trainer config.
        resource_pool: the reward model's pool (one replica per bundle).
        router: the router actor (:func:`~verl.experimental.reward_loop.router.start_reward_router`).
    """

    def __init__(self, config: Any, resource_pool: Any, router: Any) -> None:
        import ray

        from verl.experimental.reward_loop.score_server import RewardScoreServer, is_discriminative

        self.router = router
        worker_config = reward_model_worker_config(config)
        self.discriminative = is_discriminative(worker_config.model.path)
        server = (RewardScoreServer, "reward_model") if self.discriminative else (None, "rollout")
        self.worker_group, self.handles = start_model_servers(resource_pool, worker_config, "reward_model", *server)
        replicas = ray.get(router.add_servers.remote(self.handles, self.discriminative))
        kind = "discriminative" if self.discriminative else "generative"
        logger.info("%s reward model %s: %d replica(s) behind the router", kind, worker_config.model.path, replicas)

    def sleep(self) -> list[int]:
        """Free the replicas' memory until :meth:`wake_up`; returns the bytes each still holds (a generative
        judge's; a classifier's replicas have no sleep and keep theirs: [])."""
        if self.discriminative:
            return []
        held = self.worker_group.sleep()
        logger.info("reward model replicas asleep (%s bytes held)", held)
        return held

    def wake_up(self) -> None:
        """Restore the replicas' memory and weights (loaded from the model path again where the engine dropped
        them)."""
        if not self.discriminative:
            self.worker_group.wake_up()

    def get_router_address(self) -> str:
        """The router's ``host:port``."""
        import ray

        return ray.get(self.router.start.remote())
