"""DAPO dynamic sampling on real DataProto batches: informative groups are kept whole, batches accumulate until the
training batch is full, and the limit and a wrong metric are errors that name their keys."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.ppo.dynamic_sampling import StepState, accumulate_groups
from verl.utils.tracking.tables import FILTERED_REWARD_TABLE_KEY


def config(metric: str = "acc", train_batch_size: int = 3, max_num_gen_batches: int = 0):
    return OmegaConf.create(
        {
            "data": {"train_batch_size": train_batch_size},
            "actor_rollout_ref": {"rollout": {"n": 2}},
            "algorithm": {
                "filter_groups": {"enable": True, "metric": metric, "max_num_gen_batches": max_num_gen_batches}
            },
        }
    )


def scored_batch(prefix: str, acc: list[float]) -> DataProto:
    """Prompts of 2 samples each (adjacent rows), with per-sample ``acc`` and a score equal to it."""
    n = len(acc)
    scores = torch.zeros(n, 3)
    scores[:, -1] = torch.tensor(acc)
    return DataProto.from_dict(
        tensors={"token_level_scores": scores, "row": torch.arange(n)},
        non_tensors={
            "uid": np.array([f"{prefix}{i // 2}" for i in range(n)], dtype=object),
            "acc": np.array(acc, dtype=object),
        },
        meta_info={"reward_extra_keys": ["acc"]},
    )


def test_groups_accumulate_until_the_batch_is_full():
    step, cfg = StepState(metrics={}), config()
    # prompt a0 all right (dropped), a1 mixed (kept), a2 all wrong (dropped)
    assert accumulate_groups(scored_batch("a", [1, 1, 0, 1, 0, 0]), step, cfg) is None
    assert (step.kept_prompts, step.gen_batches) == (1, 1)
    # b0 mixed, b1 mixed, b2 mixed: 4 kept in all, 3 wanted → the first 3 groups, each whole
    out = accumulate_groups(scored_batch("b", [0, 1, 1, 0, 0.5, 1]), step, cfg)
    assert out is not None and len(out) == 6
    assert out.non_tensor_batch["uid"].tolist() == ["a1", "a1", "b0", "b0", "b1", "b1"]
    assert out.batch["token_level_scores"][:, -1].tolist() == [0, 1, 0, 1, 1, 0]
    assert step.metrics["train/num_gen_batches"] == 2
    assert step.metrics["training/filter_groups/evicted_samples"] == 2
    # the dropped groups by their shared value: wandb's table (the trainer pops it before the scalar metrics)
    assert step.metrics[FILTERED_REWARD_TABLE_KEY] == {1.0: 1, 0.0: 1}


def test_sequence_reward_metric_and_single_sample_groups():
    step = StepState(metrics={})
    batch = scored_batch("c", [0.2, 0.2, 0.3, 0.1])
    batch.non_tensor_batch["uid"][3] = "lonely"  # a group of one sample is kept
    out = accumulate_groups(batch, step, config(metric="seq_reward", train_batch_size=2))
    assert out is not None and out.non_tensor_batch["uid"].tolist() == ["c1", "lonely"]


def test_too_many_generation_batches_and_an_unknown_metric_are_errors():
    step, cfg = StepState(metrics={}), config(max_num_gen_batches=2)
    assert accumulate_groups(scored_batch("d", [1, 1, 0, 0]), step, cfg) is None
    with pytest.raises(ValueError, match="2 generation batches kept 0 prompts.*max_num_gen_batches"):
        accumulate_groups(scored_batch("e", [1, 1, 0, 0]), step, cfg)
    with pytest.raises(ValueError, match=r"filter_groups.metric='pass' .* reports \['acc'\]"):
        accumulate_groups(scored_batch("f", [1, 0]), StepState(metrics={}), config(metric="pass"))
