"""`MegatronPPOCritic`: the PPO critic over a `MegatronEngine` (veRL's ``verl.workers.critic.megatron_critic``).

`DataParallelPPOCritic`'s value loss and metrics, one micro-batch at a time, with the micro-batches run by
Megatron's pipeline schedule (see `verl.workers.actor.megatron_actor`); the last stage's results are shared with the
other stages.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.seqlen_balancing import restore_order
from verl.workers.actor.dp_actor import inference_micro_batches
from verl.workers.actor.megatron_actor import warn_padded_batches
from verl.workers.critic.dp_critic import DataParallelPPOCritic, response_values

__all__ = ["MegatronPPOCritic"]


class MegatronPPOCritic(DataParallelPPOCritic):
    """Args:
    config: the critic config.
    engine: the `MegatronEngine` holding the value model (role "critic").
    """

    def __init__(self, config: Any, *, engine: Any) -> None:
        super().__init__(config, engine=engine)
        if self.use_remove_padding:
            warn_padded_batches("critic")

    def _forward_micro_batch(self, micro_batch: DataProto) -> torch.Tensor:
        raise NotImplementedError(
            "MegatronPPOCritic has no single-micro-batch forward: with pipeline stages a forward is a collective "
            "schedule over all micro-batches (compute_values / update_critic run it)"
        )

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """As `DataParallelPPOCritic.compute_values`, through the pipeline schedule."""
        micro_batches, order = inference_micro_batches(data)

        def values(output: torch.Tensor, micro: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            return output.new_zeros(()), {"values": response_values(output, micro["responses"].shape[1])}

        with self.engine.eval_mode():
            results = self.engine.forward_backward([m.batch for m in micro_batches], values, forward_only=True)
        outputs = [r["values"] for r in self.engine.share_from_last_stage(results)]
        result = restore_order(outputs, order) if order is not None else torch.cat(outputs)
        if "response_mask" in data.batch.keys():
            result = result * data.batch["response_mask"].to(result.dtype)
        return result

    def _update_loss(
        self, output: torch.Tensor, micro: Any, *, batch_info: dict[str, Any], local_tokens: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        vpreds = response_values(output, micro["responses"].shape[1])
        return self._micro_batch_loss(vpreds, micro, batch_info, local_tokens)

    def _update_mini_batch(
        self, micro_batches: list[DataProto], batch_info: dict[str, Any], local_tokens: float
    ) -> dict[str, float]:
        """`DataParallelPPOCritic._update_mini_batch` through the pipeline schedule."""
        loss_fn = functools.partial(self._update_loss, batch_info=batch_info, local_tokens=local_tokens)
        results = self.engine.share_from_last_stage(
            self.engine.forward_backward([m.batch for m in micro_batches], loss_fn)
        )
        sums: dict[str, float] = defaultdict(float)
        for result in results:
            for key, value in result.items():
                sums[key] += value
        return sums
