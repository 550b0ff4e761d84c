"""The trainer's generation helpers, at veRL's names (a mixin of ``RayPPOTrainer``): the prompts of a batch
(``_get_gen_batch``), one generation through the agent loops (``_generate``), ReMax's greedy baseline
(``_compute_reward_baselines``) and the prompts' group ids (``_step_uids``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verl.experimental.agent_loop.postprocess import session_numbers
from verl.protocol import DataProto
from verl.trainer.ppo.v1.multi_trajectory import SESSION_ID, expand_to_outputs, final_rows, has_multi_outputs

__all__ = ["PROMPT_TENSORS", "REWARD_KEYS", "Generated", "TrainerGeneration"]

# non-tensor keys the reward needs; _get_gen_batch leaves them in the batch (veRL's set)
REWARD_KEYS = ("data_source", "reward_model", "extra_info", "uid")
PROMPT_TENSORS = ("input_ids", "attention_mask", "position_ids")


@dataclass(frozen=True)
class Generated:
    """One generation: the prompts' rows repeated ``n`` times joined with their responses (``batch``), the
    generation's stage ``timing`` (``generate_sequences``: its wall time) and its workers' ``metrics``
    (``agent_loop/*``, the per-sample rewards' ``reward/*`` counts)."""

    batch: DataProto
    timing: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)


class TrainerGeneration:
    """Generation helpers of :class:`~verl.trainer.ppo.ray_trainer.RayPPOTrainer` (they use its config, state,
    ``async_rollout_manager`` and reward functions)."""

    config: Any
    async_rollout_manager: Any
    global_steps: int
    reward_fn: Any
    _compute_or_extract_reward: Callable[..., Any]  # the trainer's reward stage (ReMax's baseline scores with it)

    def _get_gen_batch(self, batch: DataProto) -> DataProto:
        """Pop the prompts' tensors and every non-tensor key the reward does not need (``data_source``,
        ``reward_model``, ``extra_info``, ``uid`` stay) out of ``batch`` and return them, with ``prompt_index``
        (the row; it seeds each sample) — veRL's helper: ``_get_gen_batch(batch).repeat(n)`` is what
        ``async_rollout_manager.generate_sequences`` takes, and its output is ``union``-ed into
        ``batch.repeat(n)``."""
        keys = [k for k in PROMPT_TENSORS if k in batch.batch.keys()]
        other = [k for k in batch.non_tensor_batch if k not in REWARD_KEYS]
        gen = batch.pop(batch_keys=keys, non_tensor_batch_keys=other)
        gen.batch["prompt_index"] = torch.arange(len(gen))
        gen.non_tensor_batch.update(batch.non_tensor_batch)  # as veRL: an agent loop sees the reward's inputs too
        return gen

    def _generate(
        self,
        batch: DataProto,
        n: int | None = None,
        validate: bool = False,
        do_sample: bool = True,
        first_prompt: int = 0,
        seed_step: int | None = None,
        keep_failed: bool = False,
    ) -> Generated:
        """Generate ``n`` responses per prompt (greedy without ``do_sample``): the prompts' rows repeated ``n`` times
        joined with them, with the generation's timing and metrics (:class:`Generated`). ``batch`` itself is left
        as it was. The prompts are numbered from ``first_prompt`` (the number seeds their samples: each generation
        batch of a step needs its own), the step from ``seed_step`` (default: the current one). ``keep_failed``: a
        sample whose agent loop raises is kept as a failed sample (``__failed__``; the replay-buffer schedule's)."""
        n = n or self.config.actor_rollout_ref.rollout.n
        batch = batch.select(batch_keys=list(batch.batch.keys()))  # a shallow copy: _get_gen_batch pops from it
        gen = self._get_gen_batch(batch)
        gen.batch["prompt_index"] += first_prompt
        seed_step = self.global_steps if seed_step is None else seed_step
        gen.meta_info.update(validate=validate, global_steps=seed_step)  # the step seeds the sampling
        if not do_sample:
            gen.meta_info["do_sample"] = False
        if keep_failed:
            gen.meta_info["keep_failed_samples"] = True
        output = self.async_rollout_manager.generate_sequences(gen.repeat(n, interleave=True))
        meta = output.meta_info
        output.meta_info = {"reward_extra_keys": meta.get("reward_extra_keys", [])}
        # each row gets its prompt's columns and its session (verl.trainer.ppo.v1.multi_trajectory)
        batch = expand_to_outputs(batch.repeat(n, interleave=True), output).union(output)
        batch.non_tensor_batch[SESSION_ID] = session_numbers(output) % n
        return Generated(batch, dict(meta.get("timing", {})), dict(meta.get("metrics", {})))

    def _compute_reward_baselines(self, prompts: DataProto, batch: DataProto) -> None:
        """ReMax's baseline: the reward of one greedy response per prompt, as ``reward_baselines`` of its samples."""
        greedy = self._generate(prompts, n=1, do_sample=False).batch
        if has_multi_outputs(greedy):  # a multi-output session's baseline is its final output's reward
            greedy = greedy.select_idxs(final_rows(greedy))
        scores = self._compute_or_extract_reward(greedy, self.reward_fn, sum_reward=True)
        sessions = session_numbers(batch)
        samples_per_prompt = (int(sessions[-1]) + 1) // len(prompts)
        batch.batch["reward_baselines"] = scores[torch.as_tensor(sessions // samples_per_prompt)]

    def _step_uids(self, batch: DataProto, epoch: int, step: int | None = None) -> None:
        """Deterministic per-prompt ids from the dataset index (else the step's position) and the epoch."""
        index = batch.non_tensor_batch.get("index")
        if index is None:
            index = np.arange(len(batch)) + ((step or self.global_steps) - 1) * len(batch)
        batch.non_tensor_batch["uid"] = np.array([f"{epoch}-{i}" for i in index], dtype=object)
