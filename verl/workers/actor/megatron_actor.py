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

import dataclasses
import functools
import logging
from collections import defaultdict
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.seqlen_balancing import restore_order
from verl.workers.actor.dp_actor import DataParallelPPOActor, fold_micro_sums, iter_mini_batches, split_micro_batches

__all__ = ["MegatronPPOActor"]

logger = logging.getLogger(__name__)


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
        keys = ["responses", "input_ids", "attention_mask", "position_ids"]
        micro_batches, order = split_micro_batches(
            data.select(batch_keys=keys),
            meta.get("micro_batch_size") or len(data),
            bool(meta.get("use_dynamic_bsz", False)),
            meta.get("max_token_len"),
        )

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
        self,
        logits: torch.Tensor,
        micro: Any,
        *,
        temperature: float,
        calculate_entropy: bool,
        pieces: bool,
        loss_config: Any,
        on_policy: bool,
        local_tokens: float,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """One micro-batch's loss on the last stage, and what the update keeps of it (metric sums; on-policy, the
        log-probs and entropys that serve as the old ones)."""
        forward = self._response_outputs(
            _response_logits(logits, micro),
            micro,
            temperature,
            calculate_entropy or on_policy,
            entropy_grad=calculate_entropy,
            distillation_pieces=pieces,
        )
        loss, sums = self._micro_batch_loss(forward, micro, loss_config, on_policy, local_tokens)
        kept: dict[str, Any] = {"sums": sums}
        if on_policy:
            kept.update(old_log_probs=forward["log_probs"].detach(), entropys=forward["entropys"].detach())
        return loss, kept

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """As `DataParallelPPOActor.update_policy` (the same losses and metrics), through the pipeline schedule."""
        if self.actor_optimizer is None:
            raise RuntimeError("update_policy needs an optimizer: this actor was built for inference only")
        cfg = self.config
        on_policy = bool(data.meta_info.get("old_log_prob_in_update", False))
        self.on_policy_outputs = None
        temperature = float(data.meta_info.get("temperature", 1.0))
        mini_size = cfg.ppo_mini_batch_size_per_rank
        micro_size = cfg.ppo_micro_batch_size_per_gpu or mini_size
        data = self._update_batch(data, on_policy)
        calculate_entropy = cfg.entropy_coeff != 0 or cfg.calculate_entropy
        pieces = self.distillation is not None and self.distillation.use_topk

        metrics: dict[str, list[float]] = defaultdict(list)
        recorded: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.actor_module.train()
        for mini_batch, batch_info, local_tokens in iter_mini_batches(data, cfg, mini_size):
            loss_config = dataclasses.replace(cfg, global_batch_info=batch_info)
            micro_batches, order = split_micro_batches(
                mini_batch, micro_size, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu
            )

            loss_fn = functools.partial(
                self._update_loss,
                temperature=temperature,
                calculate_entropy=calculate_entropy,
                pieces=pieces,
                loss_config=loss_config,
                on_policy=on_policy,
                local_tokens=local_tokens,
            )
            results = self.engine.share_from_last_stage(
                self.engine.forward_backward([m.batch for m in micro_batches], loss_fn)
            )
            grad_norm = self.engine.clip_grad_norm_and_step(cfg.grad_clip)
            sums: dict[str, float] = {}
            for result in results:
                fold_micro_sums(sums, result["sums"])
                if on_policy:
                    recorded["old_log_probs"].append(result["old_log_probs"])
                    recorded["entropys"].append(result["entropys"])
            for key, value in sums.items():
                metrics[key].append(value)
            metrics["actor/grad_norm"].append(grad_norm)
            if cfg.use_kl_loss:
                metrics["actor/kl_coef"].append(cfg.kl_loss_coef)
            if on_policy:
                self.on_policy_outputs = {
                    key: restore_order(values, order) if order is not None else torch.cat(values)
                    for key, values in recorded.items()
                }
        return dict(metrics)
