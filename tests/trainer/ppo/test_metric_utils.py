"""veRL's aborted-sample and partial-rollout metrics, computed from real batch columns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.experimental.agent_loop.postprocess import object_column, version_ranges
from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import compute_data_metrics, compute_partial_rollout_metrics


def batch(lengths: list[int], token_versions: list[list[int]], resp_len: int = 4) -> DataProto:
    rows = len(lengths)
    mask = (torch.arange(resp_len)[None, :] < torch.tensor(lengths)[:, None]).long()
    zeros = torch.zeros(rows, resp_len)
    tensors = {
        "responses": torch.zeros(rows, resp_len, dtype=torch.long),
        "attention_mask": torch.cat([torch.ones(rows, 2, dtype=torch.long), mask], dim=-1),
        "response_mask": mask,
        "token_level_scores": zeros,
        "token_level_rewards": zeros,
        "advantages": zeros,
        "returns": zeros,
    }
    ranges = [version_ranges(m.tolist(), v) for m, v in zip(mask, token_versions, strict=True)]
    return DataProto.from_dict(tensors, {"weight_version_ranges": object_column(ranges)})


def test_partial_samples_their_span_and_the_resumptions():
    # sample 0: one version; 1: resumed once (3 → 4); 2: resumed twice (3 → 4 → 5); 3: no tokens
    data = batch([4, 4, 3, 0], [[3, 3, 3, 3], [3, 3, 4, 4], [3, 4, 5], []])
    metrics = compute_partial_rollout_metrics(data)
    assert metrics == {
        "fully_async/partial/total_partial_num": 2.0,
        "fully_async/partial/partial_ratio": pytest.approx(2 / 3),  # over the samples with recorded versions
        "fully_async/partial/max_partial_span": 2.0,
        "fully_async/partial/resumed_requests": 3.0,
    }
    assert compute_partial_rollout_metrics(batch([2], [[]])) == {}  # nothing recorded: nothing claimed


def test_aborted_samples_are_the_empty_responses():
    metrics = compute_data_metrics(batch([4, 2, 0, 0], [[1] * 4, [1] * 2, [], []]), use_critic=False)
    assert metrics["response/aborted_ratio"] == 0.5
    assert metrics["response_length/mean"] == 1.5
    assert metrics["response_length_non_aborted/mean"] == 3.0
    assert metrics["response_length_non_aborted/min"] == 2.0
    assert metrics["response_length_non_aborted/clip_ratio"] == 0.5
    everything = compute_data_metrics(batch([0, 0], [[], []]), use_critic=False)
    assert everything["response/aborted_ratio"] == 1.0 and "response_length_non_aborted/mean" not in everything
    assert np.isfinite(everything["response_length/mean"])
