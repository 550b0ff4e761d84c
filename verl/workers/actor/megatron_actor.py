"""`MegatronPPOActor`: the PPO actor over a `MegatronEngine` (veRL's ``verl.workers.actor.megatron_actor``).

The losses are `DataParallelPPOActor`'s, one micro-batch at a time (``_response_outputs`` from the logits, then
``_micro_batch_loss``); what differs is who runs the micro-batches: Megatron's pipeline schedule
(:meth:`~verl.workers.engine.megatron_engine.MegatronEngine.forward_backward`), which computes a micro-batch's loss
on the last pipeline stage and runs the backward through every stage. What the last stage computed (log-probs,
metrics) is then shared with the other stages, so every rank returns the same result as its tensor-parallel peers.

Every micro-batch runs through the schedule, so samples with zero advantage are not skipped; the model is fed padded
batches (``use_remove_padding`` changes nothing here: Megatron's local attention takes no packed sequences).
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.seqlen_balancing import restore_order
from verl.workers.actor.dp_actor import (
    DataParallelPPOActor,
    UpdateStep,
    fold_micro_sums,
    inference_micro_batches,
)

__all__ = ["MegatronPPOActor", "warn_padded_batches"]

logger = logging.getLogger(__name__)


def warn_padded_batches(role: str) -> None:
    """Say at start-up that ``use_remove_padding`` does nothing on the Megatron engine."""
    logger.warning(
        "%s: use_remove_padding=true has no effect on the Megatron engine here: Megatron's local attention takes "
        "padded batches, not packed sequences (same results; packing needs Transformer Engine on a GPU)",
        role,
    )


def _response_logits(logits: torch.Tensor, batch: Any) -> torch.Tensor:
    """The logits that predict the response tokens, (bs, response_length, vocab)."""
    length = batch["responses"].shape[1]
    return logits[:, -length - 1 : -1]


class MegatronPPOActor(DataParallelPPOActor):
    """Args:
    config: the actor (or reference) config.
    engine: the `MegatronEngine` holding the policy.
    distillation: the run's distillation config (its term joins the loss as in `DataParallelPPOActor`).
    """

    def __init__(self, config: Any, *, engine: Any, distillation: Any = None) -> None:
        super().__init__(config, engine=engine, distillation=distillation)
        self.zero_adv_skip_reason = "the Megatron engine runs every micro-batch through its pipeline schedule"
        self._response_logits_only = False
        if self.use_remove_padding:
            warn_padded_batches("actor_rollout_ref.actor / ref")

    def _forward_outputs(self, micro_batch: Any, temperature: float, calculate_entropy: bool, **kwargs: Any) -> dict:
        raise NotImplementedError(
            "MegatronPPOActor has no single-micro-batch forward: with pipeline stages a forward is a collective "
            "schedule over all micro-batches (compute_log_prob_outputs / update_policy run it)"
        )

    @torch.no_grad()
    def compute_log_prob_outputs(
        self, data: DataProto, calculate_entropy: bool = False, calculate_sum_pi_squared: bool = False
    ) -> dict[str, torch.Tensor]:
        """As `DataParallelPPOActor.compute_log_prob_outputs`, through the pipeline schedule."""
        meta = data.meta_info
        temperature = float(meta.get("temperature", 1.0))
        micro_batches, order = inference_micro_batches(data)

        def outputs(logits: torch.Tensor, micro: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            out = self._response_outputs(
                _response_logits(logits, micro),
                micro,
                temperature,
                calculate_entropy,
                calculate_sum_pi_squared=calculate_sum_pi_squared,
            )
            return logits.new_zeros(()), out

        with self.engine.eval_mode():
            results = self.engine.forward_backward([m.batch for m in micro_batches], outputs, forward_only=True)
        results = self.engine.share_from_last_stage(results)
        parts = {key: [r[key] for r in results] for key in results[0]}
        if order is not None:
            return {key: restore_order(values, order) for key, values in parts.items()}
        return {key: torch.cat(values) for key, values in parts.items()}

    def _update_loss(
        self, logits: torch.Tensor, micro: Any, *, step: UpdateStep
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """One micro-batch's loss on the last stage, and what the update keeps of it (metric sums; on-policy, the
        log-probs and entropys that serve as the old ones)."""
        forward = self._response_outputs(
            _response_logits(logits, micro),
            micro,
            step.temperature,
            step.calculate_entropy or step.on_policy,
            entropy_grad=step.calculate_entropy,
            distillation_pieces=self.distillation is not None and self.distillation.use_topk,
        )
        loss, sums = self._micro_batch_loss(forward, micro, step)
        kept: dict[str, Any] = {"sums": sums}
        if step.on_policy:
            kept.update(old_log_probs=forward["log_probs"].detach(), entropys=forward["entropys"].detach())
        return loss, kept

    def _update_mini_batch(
        self, micro_batches: list[DataProto], step: UpdateStep
    ) -> tuple[dict[str, float], int, dict[str, list[torch.Tensor]]]:
        """`DataParallelPPOActor._update_mini_batch` through the pipeline schedule (no row skips the gradient)."""
        loss_fn = functools.partial(self._update_loss, step=step)
        results = self.engine.share_from_last_stage(
            self.engine.forward_backward([m.batch for m in micro_batches], loss_fn)
        )
        sums: dict[str, float] = {}
        recorded: dict[str, list[torch.Tensor]] = defaultdict(list)
        for result in results:
            fold_micro_sums(sums, result["sums"])
            if step.on_policy:
                recorded["old_log_probs"].append(result["old_log_probs"])
                recorded["entropys"].append(result["entropys"])
        return sums, 0, recorded
