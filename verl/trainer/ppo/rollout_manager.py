"""The driver's handles on generation and weight sync, at veRL's names, over the actor-rollout worker group.

- :class:`RolloutManager` is ``trainer.async_rollout_manager``: ``generate_sequences(prompts)`` on prompt rows that
  are already repeated ``n`` times (veRL's call pattern: ``_get_gen_batch(batch).repeat(n)``). It fills what the
  engines need and the caller may not have set (EOS / pad ids, the step, the per-sample seeding indices), pads the
  rows to the worker count, and returns the responses with ``meta_info["timing"]`` (``{"generate_sequences": s}``,
  averaged over the ranks) and ``meta_info["metrics"]`` (the workers' other generation metrics, reduced). It is the one
  generation path of the trainer — training, ReMax's greedy baseline and validation all call it. Until the
  AgentLoop lands it is a thin layer over ``actor_rollout_wg.generate_sequences``, whatever ``rollout.mode`` says.
- :class:`CheckpointManager` is ``trainer.checkpoint_manager``: ``update_weights()`` pushes the actor's weights
  into the rollout engines (and returns the sync's metrics), ``sleep_replicas()`` frees the engines' memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.utils.metric import reduce_metrics

__all__ = ["CheckpointManager", "RolloutManager", "sample_indices"]

GENERATION_TIMER = "timing_s/generate_sequences"


def sample_indices(prompt_index: torch.Tensor) -> torch.Tensor:
    """Per row, how many earlier rows share its ``prompt_index`` (0, 1, … within each prompt's copies)."""
    out = torch.zeros_like(prompt_index)
    seen: dict[int, int] = {}
    for row, prompt in enumerate(prompt_index.tolist()):
        out[row] = seen.get(prompt, 0)
        seen[prompt] = out[row].item() + 1
    return out


class RolloutManager:
    """Generation for the driver (see the module docstring).

    Args:
        worker_group: the actor-rollout worker group (``generate_sequences`` registered on it).
        tokenizer: the policy's tokenizer (EOS and pad ids).
        step: returns the trainer's current step (it seeds sampling).
    """

    def __init__(self, worker_group: Any, tokenizer: Any, step: Callable[[], int]) -> None:
        self.worker_group = worker_group
        self.tokenizer = tokenizer
        self.step = step

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Responses for ``prompts`` (one per row); ``meta_info`` keys the caller set win over the defaults."""
        # the engines read the prompt tensors only (the AgentLoop will read raw_prompt and the tools' kwargs)
        gen = prompts.select(
            list(prompts.batch.keys()), non_tensor_batch_keys=[], meta_info_keys=list(prompts.meta_info)
        )
        gen.meta_info = {
            "eos_token_id": self.tokenizer.eos_token_id,
            "pad_token_id": self.tokenizer.pad_token_id,
            "global_steps": self.step(),
            "validate": False,
            **gen.meta_info,
            "n": 1,  # every row is one sample: the caller repeated the prompts
        }
        if "prompt_index" not in gen.batch.keys():  # set by _get_gen_batch; else every row counts as its own prompt
            gen.batch["prompt_index"] = torch.arange(len(gen))
        if "sample_index" not in gen.batch.keys():
            gen.batch["sample_index"] = sample_indices(gen.batch["prompt_index"])
        gen, pad = pad_dataproto_to_divisor(gen, self.worker_group.world_size)
        output = unpad_dataproto(self.worker_group.generate_sequences(gen), pad)
        metrics = reduce_metrics(output.meta_info.get("metrics", {}))
        seconds = metrics.pop(GENERATION_TIMER, None)
        output.meta_info = {"metrics": metrics, "timing": {} if seconds is None else {"generate_sequences": seconds}}
        output.pop(batch_keys=[k for k in ("prompt_index", "sample_index") if k in output.batch.keys()])
        return output

    def wake_up(self) -> None:
        """Restore the engines' weights and KV cache (a sleeping engine also wakes by itself to generate)."""
        self.worker_group.wake_up()

    def sleep(self) -> None:
        """Free the engines' memory."""
        self.worker_group.sleep()


class CheckpointManager:
    """Weight sync between the actor and the rollout engines of the hybrid engine (veRL's checkpoint manager)."""

    def __init__(self, worker_group: Any) -> None:
        self.worker_group = worker_group

    def update_weights(self) -> dict[str, float]:
        """Push the actor's current weights into every rollout engine; returns the sync's metrics (reduced)."""
        stats = self.worker_group.update_weights()
        return reduce_metrics({k: [s[k] for s in stats] for k in stats[0]}) if stats else {}

    def sleep_replicas(self) -> None:
        """Free the rollout engines' memory until the next generation or weight sync."""
        self.worker_group.sleep()
