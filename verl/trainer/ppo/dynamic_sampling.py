"""DAPO's dynamic sampling (``algorithm.filter_groups``): keep only the prompt groups whose samples disagree on a
metric, and generate more batches until a training batch is full.

A group whose ``n`` responses all get the same reward has zero advantage under GRPO-style estimators, so it only
dilutes the gradient. With ``filter_groups.enable``, each generation batch (``data.gen_batch_size`` prompts) is
scored, groups with zero standard deviation of ``filter_groups.metric`` are dropped (a group of one sample is kept),
and batches accumulate until ``data.train_batch_size`` prompts are kept; the surplus is cut. More than
``filter_groups.max_num_gen_batches`` batches (when > 0) is an error: the data are too easy or too hard for the
policy. It is the trainer's default *rollout filter* (``RayPPOTrainer._create_rollout_filter``): the rollout source
of every trainer mode calls ``accumulate_groups(batch, step)`` on each scored generation batch.

Paper: Q. Yu et al., "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", 2025, arXiv:2503.14476.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verl.protocol import DataProto
from verl.trainer.ppo.v1.multi_trajectory import has_multi_outputs, split_by_prompt
from verl.utils.tracking.tables import FILTERED_REWARD_TABLE_KEY

__all__ = ["StepState", "accumulate_groups", "group_filter_values"]

logger = logging.getLogger(__name__)

SEQUENCE_METRICS = ("seq_reward", "seq_final_reward")


@dataclass
class StepState:
    """What one training step collects before its update: timings, metrics, the kept groups so far."""

    metrics: dict[str, Any]
    timing: dict[str, float] = field(default_factory=dict)
    timer: Any = None
    kept: list[DataProto] = field(default_factory=list)
    kept_prompts: int = 0
    gen_batches: int = 0
    evicted_prompts: int = 0


def group_filter_values(batch: DataProto, metric: str) -> np.ndarray:
    """Each sample's value of ``filter_groups.metric``: ``seq_reward`` / ``seq_final_reward`` (the sequence's
    summed score) or a per-sample value the reward function returned (``acc``, ``score``, ...)."""
    if metric in SEQUENCE_METRICS:
        return batch.batch["token_level_scores"].sum(-1).double().numpy()
    if metric not in batch.non_tensor_batch:
        reported = sorted(batch.meta_info.get("reward_extra_keys", []))
        raise ValueError(
            f"algorithm.filter_groups.metric={metric!r} is not a per-sample value of this run: the reward function "
            f"reports {reported}; or use 'seq_reward'"
        )
    try:
        return np.asarray(batch.non_tensor_batch[metric], dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise ValueError(f"algorithm.filter_groups.metric={metric!r} has non-numeric values") from e


def _informative_rows(uids: np.ndarray, values: np.ndarray) -> tuple[list[int], int, Counter]:
    """Rows of the groups (by uid) whose values are not all equal, or that have one sample; their count; and the
    dropped groups counted by the value their samples share."""
    rows: dict[Any, list[int]] = defaultdict(list)
    for i, uid in enumerate(uids):
        rows[uid].append(i)
    kept = [index for index in rows.values() if len(index) == 1 or np.std(values[index]) > 0]
    dropped = Counter(
        float(values[index[0]]) for index in rows.values() if len(index) > 1 and np.std(values[index]) == 0
    )
    return sorted(i for index in kept for i in index), len(kept), dropped


def accumulate_groups(batch: DataProto, step: StepState, config: Any) -> DataProto | None:
    """Add the informative groups of a scored generation batch to ``step``; return the training batch
    (``data.train_batch_size`` prompts × ``rollout.n``) once there are enough, else None. Logs
    ``train/num_gen_batches`` and veRL 0.10's ``training/filter_groups/evicted_samples`` (prompt groups dropped)
    and ``training/filter_groups/discarded_surplus_samples`` (informative groups beyond the training batch)."""
    filter_cfg = config.algorithm.filter_groups
    values = group_filter_values(batch, filter_cfg.metric)
    rows, prompts, dropped = _informative_rows(batch.non_tensor_batch["uid"], values)
    step.gen_batches += 1
    step.kept_prompts += prompts
    step.evicted_prompts += dropped.total()
    if dropped:  # the trainer sends it to wandb's table (DapoFilteredRewardTableLogger), not to the scalar metrics
        merged = Counter(step.metrics.get(FILTERED_REWARD_TABLE_KEY, {})) + dropped
        step.metrics[FILTERED_REWARD_TABLE_KEY] = dict(merged)
    if rows:
        step.kept.append(batch.select_idxs(rows))
    step.metrics["train/num_gen_batches"] = step.gen_batches
    step.metrics["training/filter_groups/evicted_samples"] = step.evicted_prompts
    wanted = int(config.data.train_batch_size)
    if step.kept_prompts < wanted:
        limit = int(filter_cfg.max_num_gen_batches or 0)
        if 0 < limit <= step.gen_batches:
            raise ValueError(
                f"dynamic sampling: {step.gen_batches} generation batches kept {step.kept_prompts} prompts whose "
                f"{filter_cfg.metric!r} varies, fewer than data.train_batch_size={wanted}: the data are too easy or "
                f"too hard for the policy; raise algorithm.filter_groups.max_num_gen_batches (0: no limit) or "
                f"data.gen_batch_size"
            )
        logger.info("dynamic sampling: %d/%d prompts after %d batches", step.kept_prompts, wanted, step.gen_batches)
        return None
    step.metrics["training/filter_groups/discarded_surplus_samples"] = step.kept_prompts - wanted
    merged = DataProto.concat(step.kept)
    if has_multi_outputs(merged):  # the first `wanted` prompt groups, with all their outputs
        return DataProto.concat(split_by_prompt(merged, step.kept_prompts)[:wanted])
    return merged[: wanted * int(config.actor_rollout_ref.rollout.n)]
