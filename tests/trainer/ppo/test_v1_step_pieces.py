"""veRL 0.10's stand-alone pieces of its V1 step: the per-step metric reduction over inner updates, and GRPO
advantages of multi-output sessions (the final output sets the group statistics, the session shares them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.v1 import MetricsAggregator, compute_advantage_for_multi_trajectories
from verl.trainer.ppo.v1.metrics import reduction


def test_each_metric_is_reduced_by_its_name():
    agg = MetricsAggregator()
    agg.add_step_metrics(
        {
            "actor/pg_loss": 1.0,
            "timing_s/update_actor": 2.0,
            "response_length/max": 5.0,
            "actor/lr": 0.1,
            "training/off_policy/evicted_samples": 1,
            "training/off_policy/evicted_samples_staleness/mean": 4.0,
            "flag": True,
            "global_seqlen/min": 3.0,
            "global_seqlen/max": 9.0,
            "global_seqlen/minmax_diff": 6.0,
        },
        sample_count=1,
    )
    agg.add_step_metrics(
        {
            "actor/pg_loss": torch.tensor(4.0),
            "timing_s/update_actor": 3.0,
            "response_length/max": 2.0,
            "actor/lr": 0.2,
            "training/off_policy/evicted_samples": 3,
            "training/off_policy/evicted_samples_staleness/mean": 8.0,
            "global_seqlen/min": 1.0,
            "global_seqlen/max": 4.0,
            "global_seqlen/minmax_diff": 3.0,
        },
        sample_count=3,
    )
    out = agg.get_aggregated_metrics()
    assert out["actor/pg_loss"] == pytest.approx((1 * 1 + 4 * 3) / 4)  # weighted by samples
    assert out["timing_s/update_actor"] == 5.0 and out["response_length/max"] == 5.0 and out["actor/lr"] == 0.2
    assert out["training/off_policy/evicted_samples"] == 4
    assert out["training/off_policy/evicted_samples_staleness/mean"] == pytest.approx((4 * 1 + 8 * 3) / 4)
    assert out["global_seqlen/minmax_diff"] == 9.0 - 1.0 and "flag" not in out
    assert [reduction(n) for n in ("a/total_tokens", "x/min", "training/global_step", "x")] == [
        "sum",
        "min",
        "last",
        "mean",
    ]
    agg.reset()
    assert agg.get_aggregated_metrics() == {}


def _batch(rewards: list[float], lengths: list[int]) -> DataProto:
    width = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    scores = torch.zeros(len(rewards), width)
    for i, (r, n) in enumerate(zip(rewards, lengths)):
        scores[i, n - 1] = r
    uids = np.array([k.split("_")[0] for k in KEYS], dtype=object)
    return DataProto.from_dict({"token_level_rewards": scores, "response_mask": mask}, {"uid": uids})


# two prompts (u, v), two sessions each; session u_0 emitted two outputs (0 then 1), the others one
KEYS = ["u_0_0", "u_0_1", "u_1_0", "v_0_0", "v_1_0"]


def test_grpo_uses_each_sessions_final_output_and_broadcasts_it():
    # the final outputs score u_0: 1, u_1: 0, v_0: 3, v_1: 1; u_0's first output (reward 7) is not in the statistics
    data = _batch([7.0, 1.0, 0.0, 3.0, 1.0], [2, 3, 1, 2, 2])
    out = compute_advantage_for_multi_trajectories(data, KEYS, "grpo")
    # GRPO over the finals: group u = [1, 0] → ±0.5 / std 0.7071, group v = [3, 1] → ±1 / std 1.4142
    z = 1 / np.sqrt(2)
    expected_rows = [z, z, -z, z, -z]
    for row, (value, n) in enumerate(zip(expected_rows, [2, 3, 1, 2, 2])):
        adv = out.batch["advantages"][row]
        assert torch.allclose(adv[:n], torch.full((n,), value), atol=1e-5) and torch.all(adv[n:] == 0)
    assert torch.equal(out.batch["returns"], out.batch["advantages"])


def test_other_estimators_and_bad_keys():
    data = _batch([7.0, 1.0, 0.0, 3.0, 1.0], [2, 3, 1, 2, 2])
    rloo = compute_advantage_for_multi_trajectories(data, KEYS, "rloo")  # the whole batch, unchanged
    assert rloo.batch["advantages"].shape == (5, 3)
    with pytest.raises(ValueError, match="'u-0' is not of the form"):
        compute_advantage_for_multi_trajectories(_batch([1.0] * 5, [1] * 5), ["u-0", *KEYS[1:]], "grpo")
