"""`DataParallelPPOCritic`: value predictions and the clipped value-loss update over a data-parallel value model.

The value model is a LM backbone with a scalar head (e.g. ``AutoModelForTokenClassification`` with one label); the
value of response token ``t`` is read at the position before it, like the policy's log-prob.

``model.use_remove_padding`` (no pad tokens in the forward) and ``use_dynamic_bsz`` (token-budget micro-batches)
work as in `DataParallelPPOActor` and give the same values and updates as the padded, fixed-size path.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

from verl.algorithms.core_algos import compute_value_loss
from verl.base_config import omega_conf_to_dataclass
from verl.protocol import DataProto
from verl.utils.padding import forward_without_padding, pad_input
from verl.utils.seqlen_balancing import restore_order
from verl.utils.torch_functional import masked_mean
from verl.workers.actor.dp_actor import inference_micro_batches, iter_mini_batches, split_micro_batches
from verl.workers.config.critic import CriticConfig
from verl.workers.engine.base import TrainingEngine, as_engine

__all__ = ["DataParallelPPOCritic", "response_values"]


def response_values(values: torch.Tensor, response_length: int) -> torch.Tensor:
    """The values at the positions that read the response tokens, (bs, response_length) in fp32, from a value
    model's (bs, seq[, 1]) output."""
    values = values.squeeze(-1) if values.dim() == 3 else values
    return values[:, -response_length - 1 : -1].float()


class DataParallelPPOCritic:
    """The PPO critic on one data-parallel rank.

    Args:
        config: the critic config: a ``CriticConfig`` or a mapping of its fields (``ppo_mini_batch_size_per_rank``
            is derived from ppo_mini_batch_size × rollout_n ÷ data_parallel_size).
        critic_module, critic_optimizer: veRL's signature: a value model (and optimizer) built by the caller, wrapped
            in a :class:`~verl.workers.engine.base.ModuleEngine`. Give ``engine`` instead to step through a training
            engine (the worker passes its ``FSDPEngine``).
        engine: the training engine whose ``module``, ``clip_grad_norm_and_step`` and ``eval_mode`` are used.
    """

    def __init__(
        self,
        config: Any,
        critic_module: torch.nn.Module | None = None,
        critic_optimizer: torch.optim.Optimizer | None = None,
        *,
        engine: TrainingEngine | None = None,
    ):
        self.config: CriticConfig = omega_conf_to_dataclass(config, CriticConfig)
        self.engine = engine = as_engine(engine, critic_module, critic_optimizer, "DataParallelPPOCritic")
        self.critic_module = engine.module
        self.critic_optimizer = engine.optimizer
        self.use_remove_padding = self.config.model.use_remove_padding

    def _forward_micro_batch(self, micro_batch: DataProto) -> torch.Tensor:
        """Values of the response tokens. Shape: (micro_bs, response_length); 0 where the reading position is
        padding in the packed (``use_remove_padding``) path."""
        batch = micro_batch.batch
        bs, response_length = batch["responses"].shape
        if self.use_remove_padding:
            output, keep, slot = forward_without_padding(
                self.critic_module, batch["input_ids"], batch["attention_mask"], batch["position_ids"], response_length
            )
        else:
            output = self.critic_module(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"],
                use_cache=False,
            )
        values = output.logits if hasattr(output, "logits") else output[0]
        if self.use_remove_padding:
            values = values.squeeze(-1) if values.dim() == 3 else values
            return pad_input(values.flatten(0, 1)[keep].float(), slot, bs, response_length)
        return response_values(values, response_length)

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values of ``data``'s response tokens, 0 outside the response mask. Shape: (bs, response_length).

        Reads ``meta_info``: ``micro_batch_size`` (default: the whole batch) and ``use_dynamic_bsz`` /
        ``max_token_len`` (token-budget micro-batches; rows come back in ``data``'s order).
        """
        micro_batches, order = inference_micro_batches(data)
        with self.engine.eval_mode():  # eval, no grad; FSDP2 frees the gathered parameters after
            outputs = [self._forward_micro_batch(m) for m in micro_batches]
        values = restore_order(outputs, order) if order is not None else torch.cat(outputs)
        if "response_mask" in data.batch.keys():
            values = values * data.batch["response_mask"].to(values.dtype)
        return values

    def _micro_batch_loss(
        self, vpreds: torch.Tensor, mb: Any, batch_info: dict[str, Any], local_tokens: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss of one micro-batch (its share of the mini-batch's) from its predicted values, and
        its contributions to the ``critic/*`` metrics (``local_tokens``: this rank's tokens in the mini-batch)."""
        cfg = self.config
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds=vpreds,
            returns=mb["returns"],
            values=mb["values"],
            response_mask=mb["response_mask"],
            cliprange_value=cfg.cliprange_value,
            loss_agg_mode=cfg.loss_agg_mode,
            **batch_info,
        )
        weight = float(mb["response_mask"].sum()) / local_tokens
        return vf_loss, {
            "critic/vf_loss": float(vf_loss.detach()),
            "critic/vf_clipfrac": float(vf_clipfrac) * weight,
            "critic/vpred_mean": float(masked_mean(vpreds.detach(), mb["response_mask"])) * weight,
        }

    def _update_batch(self, data: DataProto) -> DataProto:
        """The keys of ``data`` the update reads (an error naming the missing ones)."""
        keys = ["responses", "response_mask", "input_ids", "attention_mask", "position_ids", "values", "returns"]
        missing = [k for k in keys if k not in data.batch.keys()]
        if missing:
            raise KeyError(f"update_critic needs batch keys {missing}")
        return data.select(batch_keys=keys)

    def _update_mini_batch(
        self, micro_batches: list[DataProto], batch_info: dict[str, Any], local_tokens: float
    ) -> dict[str, float]:
        """Forward and backward of one mini-batch's micro-batches (the gradients accumulate; the caller steps);
        the mini-batch's metric sums."""
        sums: dict[str, float] = defaultdict(float)
        for micro in micro_batches:
            vf_loss, micro_sums = self._micro_batch_loss(
                self._forward_micro_batch(micro), micro.batch, batch_info, local_tokens
            )
            vf_loss.backward()
            for key, value in micro_sums.items():
                sums[key] += value
        return sums

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """``ppo_epochs`` passes of mini-batch updates of the clipped value loss. Returns ``critic/*`` metrics."""
        if self.critic_optimizer is None:
            raise RuntimeError("update_critic needs an optimizer: this critic was built for inference only")
        cfg = self.config
        data = self._update_batch(data)
        mini_size = cfg.ppo_mini_batch_size_per_rank
        micro_size = cfg.ppo_micro_batch_size_per_gpu or mini_size
        metrics: dict[str, list[float]] = defaultdict(list)
        self.critic_module.train()
        for mini_batch, batch_info, local_tokens in iter_mini_batches(data, cfg, mini_size):
            micro_batches, _ = split_micro_batches(
                mini_batch, micro_size, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu
            )
            sums = self._update_mini_batch(micro_batches, batch_info, local_tokens)
            grad_norm = self.engine.clip_grad_norm_and_step(cfg.grad_clip)
            for key, value in sums.items():
                metrics[key].append(value)
            metrics["critic/grad_norm"].append(grad_norm)
        return dict(metrics)
