"""The actor's on-policy distillation term (``distillation.enabled``): what the update reads from the batch, what the
student's forward adds for top-k losses, and how the term joins the policy loss and its metrics.

The batch carries the teacher's view of each response token, aligned with ``responses``: ``teacher_logprobs``
(bs, T, K) and, for top-k losses, ``teacher_ids`` (bs, T, K) — K = 1 (the sampled token's log-prob) for the
single-sample estimators, ``topk`` for ``forward_kl_topk``. The loss itself is
:func:`verl.algorithms.distillation.distillation_ppo_loss`.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms.distillation import compute_forward_kl_topk, distillation_ppo_loss
from verl.workers.config.distillation import DistillationConfig

__all__ = ["DistillationTerm", "reduce_micro_metrics"]

TOPK_PIECES = ("distillation_losses", "student_mass", "teacher_mass", "overlap_count", "overlap_token_advantage")


class DistillationTerm:
    """Args:
    config: the run's distillation config (enabled).
    """

    def __init__(self, config: DistillationConfig) -> None:
        self.config = config
        self.loss = config.distillation_loss
        self.use_topk = self.loss.use_topk

    def batch_keys(self, on_policy: bool) -> list[str]:
        """The batch keys the update reads for the term (``old_log_probs`` for the policy-gradient form, unless
        the update is on-policy and computes them)."""
        keys = ["teacher_logprobs", *(["teacher_ids"] if self.use_topk else [])]
        if self.loss.use_policy_gradient and not on_policy:
            keys.append("old_log_probs")
        return keys

    def topk_pieces(self, logits: torch.Tensor, batch: Any, slot: torch.Tensor | None) -> dict[str, torch.Tensor]:
        """For top-k losses, the per-position pieces of the forward KL from the response positions' ``logits``
        ((bs, T, V), or (kept, V) with ``slot`` the kept positions of the flattened (bs·T) layout); {} otherwise."""
        if not self.use_topk:
            return {}
        ids, log_probs = batch["teacher_ids"], batch["teacher_logprobs"]
        if slot is not None:
            k = ids.shape[-1]
            ids, log_probs = ids.reshape(-1, k)[slot][None], log_probs.reshape(-1, k)[slot][None]
            pieces = compute_forward_kl_topk(logits[None], log_probs, ids, self.config)
            return {key: pieces[key][0] for key in TOPK_PIECES}
        pieces = compute_forward_kl_topk(logits, log_probs, ids, self.config)
        return {key: pieces[key] for key in TOPK_PIECES}

    def add(
        self,
        policy_loss: torch.Tensor,
        actor_config: Any,
        forward: dict[str, torch.Tensor],
        batch: Any,
        old_log_probs: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The actor's loss with the term, and its ``distillation/*`` metrics."""
        data = {
            "response_mask": batch["response_mask"],
            "teacher_logprobs": batch["teacher_logprobs"],
            "old_log_probs": old_log_probs,
            **({"teacher_ids": batch["teacher_ids"]} if self.use_topk else {}),
        }
        if "rollout_is_weights" in batch.keys():
            data["rollout_is_weights"] = batch["rollout_is_weights"]
        return distillation_ppo_loss(policy_loss, actor_config, self.config, forward, data)


def reduce_micro_metrics(sums: dict[str, float], metrics: dict[str, float], weight: float) -> None:
    """Fold one micro-batch's ``distillation/*`` metrics into the mini-batch's (as ``actor/distillation/*``): the
    loss adds up (each micro-batch's is already its share of the mini-batch's), ``_min`` / ``_max`` keep the extreme,
    the others add up weighted by the micro-batch's share of the tokens."""
    for key, value in metrics.items():
        name = f"actor/{key}"
        if key == "distillation/loss":
            sums[name] = sums.get(name, 0.0) + value
        elif key.endswith("_min"):
            sums[name] = min(sums.get(name, float("inf")), value)
        elif key.endswith("_max"):
            sums[name] = max(sums.get(name, float("-inf")), value)
        else:
            sums[name] = sums.get(name, 0.0) + value * weight
