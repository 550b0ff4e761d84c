"""The trainer's stages at veRL's helper names (a part of ``RayPPOTrainer``): the reward, the batch balance, the
old / reference log-probs, the values, the advantages (and PF-PPO's resampling), the critic's and the actor's
updates. ``fit()`` runs them in ``_train_part``; a recipe's own ``fit()`` calls them with veRL's arguments and gets
veRL's return values."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_pf_ppo_reweight_data
from verl.trainer.ppo.metric_utils import reduce_metrics
from verl.trainer.ppo.reward import compute_reward_with_metrics
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_add_to_batch
from verl.trainer.ppo.utils import apply_kl_penalty, compute_advantage
from verl.trainer.ppo.v1.multi_trajectory import (
    compute_advantage_for_multi_trajectories,
    has_multi_outputs,
    share_final_reward,
    trajectory_keys,
)
from verl.utils.seqlen_balancing import balance_batch

__all__ = ["TrainerStages"]


class TrainerStages:
    """The stage helpers of :class:`~verl.trainer.ppo.ray_trainer.RayPPOTrainer` over its worker groups."""

    config: Any
    global_steps: int
    reward_fn: Any
    use_rm: bool
    rm_wg: Any
    actor_rollout_wg: Any
    ref_policy_wg: Any
    critic_wg: Any
    rollout_correction: bool
    kl_ctrl_in_reward: Any

    def _compute_or_extract_reward(
        self, batch: DataProto, reward_fn: Any = None, return_dict: bool = False, sum_reward: bool = False
    ) -> Any:
        """veRL's helper: the reward of ``batch``, read from ``rm_scores`` when present (a reward model scored it),
        else computed by ``reward_fn`` (default: the training reward function).

        Returns ``{"reward_tensor", "reward_extra_info", "reward_metrics"}`` with ``return_dict``; else the summed
        tensor (one score per sample) with ``sum_reward``, and ``(reward_tensor, reward_extra_infos_dict)``
        without."""
        if "rm_scores" in batch.batch.keys():
            keys = batch.meta_info.get("reward_extra_keys", [])
            tensor, extra, metrics = batch.batch["rm_scores"], {k: list(batch.non_tensor_batch[k]) for k in keys}, {}
        else:
            tensor, extra, metrics = compute_reward_with_metrics(batch, reward_fn or self.reward_fn)
        if sum_reward:
            tensor = tensor.sum(-1)
        if return_dict:
            return {"reward_tensor": tensor, "reward_extra_info": extra, "reward_metrics": metrics}
        return tensor if sum_reward else (tensor, extra)

    def _compute_reward(self, batch: DataProto) -> dict[str, Any]:
        if self.use_rm:
            batch = batch.union(self.rm_wg.compute_rm_score(batch))
        result = self._compute_or_extract_reward(batch, self.reward_fn, return_dict=True)
        if has_multi_outputs(batch):  # a session's final output scores all of it (veRL 0.10)
            result["reward_tensor"] = share_final_reward(batch, result["reward_tensor"])
        batch.batch["token_level_scores"] = result["reward_tensor"]
        extra = {key: values for key, values in result["reward_extra_info"].items() if len(values) == len(batch)}
        for key, values in extra.items():
            batch.non_tensor_batch[key] = np.asarray(values, dtype=object)
        batch.meta_info["reward_extra_keys"] = list(extra)
        return reduce_metrics(result["reward_metrics"])

    def _balance_batch(self, batch: DataProto, metrics: dict[str, Any], logging_prefix: str = "global_seqlen") -> None:
        """Reorder ``batch`` in place so each data-parallel rank gets a similar token total; adds
        ``<logging_prefix>/*`` to ``metrics`` (veRL's helper)."""
        _, balance_metrics = balance_batch(batch, self.actor_rollout_wg.world_size, prefix=logging_prefix)
        metrics.update(balance_metrics)

    def _compute_old_log_prob(self, batch: DataProto) -> tuple[DataProto, float]:
        """The actor's ``old_log_probs`` and ``entropys`` of ``batch`` (metrics in ``meta_info["metrics"]``), and
        the MFU — veRL's helper. MFU is not measured here: 0.0, as from veRL's legacy workers."""
        return self.actor_rollout_wg.compute_log_prob(batch), 0.0

    def _old_log_prob_stage(self, batch: DataProto) -> dict[str, Any]:
        """``old_log_probs`` into the batch; then, with ``algorithm.rollout_correction.rollout_is`` / ``rollout_rs``,
        the IS weights and the rejection mask against the rollout engine's log-probs."""
        out, _ = self._compute_old_log_prob(batch)
        metrics = reduce_metrics(out.meta_info.pop("metrics", {}))
        out.pop(batch_keys=[k for k in ("entropys",) if k in out.batch.keys()])
        batch.union(out)
        if self.rollout_correction:
            _, correction_metrics = compute_rollout_correction_and_add_to_batch(
                batch, self.config.algorithm.rollout_correction
            )
            metrics.update(correction_metrics)
        return metrics

    def _compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        """``ref_log_prob`` of ``batch`` from the reference policy (veRL's helper)."""
        return self.ref_policy_wg.compute_ref_log_prob(batch)

    def _compute_values(self, batch: DataProto) -> DataProto:
        """The critic's ``values`` of ``batch`` (veRL's helper)."""
        return self.critic_wg.compute_values(batch)

    def _compute_advantage(self, batch: DataProto) -> dict[str, Any]:
        algo = self.config.algorithm
        metrics: dict[str, Any] = {}
        if self.kl_ctrl_in_reward is not None:
            batch, metrics = apply_kl_penalty(batch, self.kl_ctrl_in_reward, algo.kl_penalty)
        else:
            batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
        kwargs = {
            "gamma": algo.gamma,
            "lam": algo.lam,
            "num_repeat": self.config.actor_rollout_ref.rollout.n,
            "norm_adv_by_std_in_grpo": algo.norm_adv_by_std_in_grpo,
            "config": algo,
        }
        if has_multi_outputs(batch):  # veRL 0.10: GRPO's groups are the sessions' final outputs
            compute_advantage_for_multi_trajectories(batch, trajectory_keys(batch), algo.adv_estimator, **kwargs)
        else:
            compute_advantage(batch, algo.adv_estimator, **kwargs)
        return metrics

    def _pf_ppo_resample(self, batch: DataProto) -> DataProto:
        """PF-PPO: the batch resampled with replacement, weighted by score (``algorithm.pf_ppo``); the draw is
        seeded by ``data.seed`` and the step, so a resumed run draws the same rows."""
        pf = self.config.algorithm.pf_ppo
        seed = int(self.config.data.get("seed") or 1) * 1_000_003 + self.global_steps
        generator = torch.Generator().manual_seed(seed)
        return compute_pf_ppo_reweight_data(batch, pf.reweight_method, pf.weight_pow, generator=generator)

    def _update_critic(self, batch: DataProto) -> DataProto:
        """One critic update on ``batch``; its metrics are in ``meta_info["metrics"]`` (veRL's helper)."""
        return self.critic_wg.update_critic(batch)

    def _update_actor(self, batch: DataProto) -> DataProto:
        """One actor update on ``batch``; its metrics are in ``meta_info["metrics"]`` (veRL's helper)."""
        batch.meta_info["temperature"] = self.config.actor_rollout_ref.rollout.temperature
        return self.actor_rollout_wg.update_actor(batch)

    def _updates_actor(self) -> bool:
        """Whether this step updates the actor (and pushes its weights): from step ``trainer.critic_warmup`` on."""
        return self.config.trainer.critic_warmup <= self.global_steps
