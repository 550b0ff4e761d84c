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


def _outputs(index: list[int], uids: list[str]) -> DataProto:
    """Rows of a rollout: ``__trajectory_index__`` numbers each sample's outputs."""
    rows = len(index)
    return DataProto.from_dict(
        {"responses": torch.arange(rows).unsqueeze(1), "response_mask": torch.ones(rows, 1)},
        {"__trajectory_index__": np.array(index), "uid": np.array(uids, dtype=object)},
    )


def test_a_batch_with_multi_output_sessions_joins_splits_keys_and_pads():
    from verl.experimental.agent_loop.postprocess import final_rows, session_numbers
    from verl.trainer.ppo.v1.multi_trajectory import (
        PADDING_COLUMN,
        expand_to_outputs,
        has_multi_outputs,
        pad_rows,
        share_final_reward,
        split_by_prompt,
        trajectory_keys,
    )

    # 2 prompts × 2 samples; sample 0 of prompt a emitted 2 outputs, sample 1 of prompt b emitted 3
    out = _outputs([0, 1, 0, 0, 0, 1, 2], ["a", "a", "a", "b", "b", "b", "b"])
    assert has_multi_outputs(out) and not has_multi_outputs(_outputs([0, 0], ["a", "a"]))
    assert session_numbers(out).tolist() == [0, 0, 1, 2, 3, 3, 3] and final_rows(out).tolist() == [1, 2, 3, 6]
    assert trajectory_keys(out) == ["a_0_0", "a_0_1", "a_1_0", "b_2_0", "b_3_0", "b_3_1", "b_3_2"]
    prompts = DataProto.from_dict({"prompt_index": torch.tensor([10, 10, 11, 11])})  # the samples, repeated n=2
    joined = expand_to_outputs(prompts, out)
    assert joined.batch["prompt_index"].tolist() == [10, 10, 10, 11, 11, 11, 11]
    with pytest.raises(ValueError, match="outputs of 4 samples for 6 prompts' samples"):
        expand_to_outputs(DataProto.from_dict({"prompt_index": torch.arange(6)}), out)
    groups = split_by_prompt(out, 2)  # each prompt's samples with all their outputs
    assert [g.batch["responses"].flatten().tolist() for g in groups] == [[0, 1, 2], [3, 4, 5, 6]]
    with pytest.raises(ValueError, match="4 samples do not split into 3 prompt groups"):
        split_by_prompt(out, 3)
    # padded for 4 ranks: one row that trains nothing, its own prompt and sample
    padded = pad_rows(out, 4)
    assert len(padded) == 8 and padded.non_tensor_batch[PADDING_COLUMN].tolist() == [False] * 7 + [True]
    assert padded.batch["response_mask"][7].sum() == 0 and padded.non_tensor_batch["uid"][7] == "pad-0"
    assert session_numbers(padded).tolist()[-1] == 4 and pad_rows(padded, 4) is padded
    # the trainer's join names each row's session (its sample within the prompt): keys and finals survive a reorder
    out.non_tensor_batch["session_id"] = np.array([0, 0, 1, 0, 1, 1, 1])
    keys = trajectory_keys(out)
    assert keys == ["a_0_0", "a_0_1", "a_1_0", "b_0_0", "b_1_0", "b_1_1", "b_1_2"]
    shuffled = out.select_idxs([6, 0, 3, 5, 2, 1, 4])
    assert trajectory_keys(shuffled) == [keys[i] for i in (6, 0, 3, 5, 2, 1, 4)]
    assert sorted(shuffled.batch["responses"][final_rows(shuffled)].flatten().tolist()) == [1, 2, 3, 6]
    # a reward computed per row (a reward model, the trainer's reward function): the final output's for the session
    out.batch["attention_mask"] = torch.tensor([[1, 1], [1, 0], [1, 1], [1, 1], [1, 1], [1, 1], [1, 0]])
    reward = torch.tensor([[0.0, 9.0], [5.0, 0.0], [0.0, 1.0], [0.0, 2.0], [0.0, 3.0], [0.0, 4.0], [6.0, 0.0]])
    shared = share_final_reward(out, reward)
    assert shared.tolist() == [[0, 5], [5, 0], [0, 1], [0, 2], [0, 6], [0, 6], [6, 0]]


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_padding_rows_train_nothing(loss_agg_mode):
    """A batch padded for the ranks (:func:`pad_rows`) takes the unpadded batch's step: a real tiny Qwen2's update,
    SGD, the padding rows' advantages zero as every estimator makes them (their response mask is)."""
    from tests.workers.actor.test_dp_actor import config, make_actor, make_ragged_batch
    from verl.trainer.ppo.v1.multi_trajectory import pad_rows

    def step(data: DataProto) -> list[torch.Tensor]:
        data.batch["advantages"] *= data.batch["response_mask"]
        cfg = config(ppo_mini_batch_size=len(data), ppo_micro_batch_size_per_gpu=3, use_kl_loss=False)
        actor = make_actor({**cfg, "loss_agg_mode": loss_agg_mode})
        actor.update_policy(data)
        return [p.detach().clone() for p in actor.actor_module.parameters()]

    def batch() -> DataProto:
        data = make_ragged_batch()
        data.non_tensor_batch["uid"] = np.array([f"u{i // 2}" for i in range(len(data))], dtype=object)
        return data

    expected, padded = step(batch()), pad_rows(batch(), 11)
    assert len(padded) == 11
    for got, want in zip(step(padded), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))
