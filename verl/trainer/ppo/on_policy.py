"""When the old-log-prob pass can be skipped: the update computes the same log-probs itself.

With one PPO epoch and one mini-batch the update's first (and only) forward runs the weights that generated
nothing since the old-log-prob pass would have run, on the same rows, cut into the same micro-batches: its
log-probs *are* the old ones, bit for bit. The actor then takes them as ``old_log_probs`` (detached) and returns
them with the pass's metrics (``actor/entropy``, the rollout mismatch), so the step logs what it would have
logged, one forward pass cheaper (``actor_rollout_ref.actor.skip_on_policy_old_log_prob``, on by default).

The pass stays when something reads the old log-probs before the update (rollout correction, the KL in the
reward, an estimator that takes them or Σπ²), when the update's cut differs from the pass's (several epochs or
mini-batches, a shuffle, other micro-batch sizes or token budgets), and when a recipe overrides the pass. A model
with dropout is handled in the worker (its train-mode forward is random: the pass runs there first).
"""

from __future__ import annotations

import inspect
from typing import Any

from verl.algorithms.registry import get_adv_estimator_fn
from verl.trainer.config.validate import world_size

__all__ = ["old_log_prob_in_update"]


def old_log_prob_in_update(trainer: Any) -> tuple[bool, str]:
    """(whether every training step's old log-probs come from its update, why not when they do not)."""
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    config = trainer.config
    actor, rollout = config.actor_rollout_ref.actor, config.actor_rollout_ref.rollout
    algorithm = config.algorithm
    if not actor.get("skip_on_policy_old_log_prob", True):
        return False, "actor.skip_on_policy_old_log_prob=false"
    if trainer.bypass_mode:
        return False, "bypass mode (the rollout's log-probs are the old ones)"
    for name in ("_compute_old_log_prob", "_old_log_prob_stage"):
        if getattr(type(trainer), name) is not getattr(RayPPOTrainer, name):
            return False, f"{type(trainer).__name__} overrides {name}"
    if actor.ppo_epochs != 1 or actor.ppo_mini_batch_size != config.data.train_batch_size:
        return False, "more than one PPO epoch or mini-batch (ppo_epochs, ppo_mini_batch_size)"
    if actor.get("shuffle", False):
        return False, "actor.shuffle reorders the update's rows"
    rank_rows = config.data.train_batch_size * rollout.n // world_size(config)
    same_cut = bool(actor.use_dynamic_bsz) == bool(rollout.log_prob_use_dynamic_bsz) and (
        actor.ppo_max_token_len_per_gpu == rollout.log_prob_max_token_len_per_gpu
        if actor.use_dynamic_bsz
        else (actor.ppo_micro_batch_size_per_gpu or rank_rows)
        == (rollout.log_prob_micro_batch_size_per_gpu or rank_rows)
    )
    if not same_cut:
        return False, "the update's micro-batches differ from the log-prob pass's"
    if trainer.rollout_correction or algorithm.use_kl_in_reward or actor.get("calculate_sum_pi_squared", False):
        return False, "rollout correction, the KL in the reward or Σπ² read the old log-probs before the update"
    estimator = get_adv_estimator_fn(algorithm.adv_estimator)
    if {"old_log_probs", "sum_pi_squared"} & set(inspect.signature(estimator).parameters):
        return False, f"the {algorithm.adv_estimator} estimator reads the old log-probs"
    return True, ""
