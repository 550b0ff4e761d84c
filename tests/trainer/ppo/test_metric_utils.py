"""veRL's aborted-sample, partial-rollout, timing and throughput metrics, computed from real batch columns;
veRL's one-class `Metric`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.experimental.agent_loop.postprocess import object_column, version_ranges
from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import (
    _compute_response_info,
    compute_data_metrics,
    compute_partial_rollout_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
)
from verl.utils.metric import AggregationType, Metric, MetricList, reduce_metrics
from verl.utils.metric.utils import AggregationTypeMismatchError


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


def test_response_info_prefers_the_response_mask_and_falls_back_to_the_attention_mask():
    data = batch([4, 1], [[1] * 4, [1]])
    info = _compute_response_info(data)
    assert info["prompt_length"].tolist() == [2.0, 2.0] and info["response_length"].tolist() == [4.0, 1.0]
    data.batch["response_mask"] = torch.tensor([[1, 0, 0, 1], [1, 0, 0, 0]])  # a tool observation in the middle
    assert _compute_response_info(data)["response_length"].tolist() == [2.0, 1.0]
    no_mask = DataProto.from_dict({k: v for k, v in data.batch.items() if k != "response_mask"})
    assert _compute_response_info(no_mask)["response_length"].tolist() == [4.0, 1.0]  # attention_mask's reading


def test_timing_per_token_uses_response_tokens_for_generation_and_all_tokens_for_the_rest():
    data = batch([4, 1], [[1] * 4, [1]])  # 5 response tokens, 4 prompt tokens
    metrics = compute_timing_metrics(data, {"gen": 0.5, "ref": 0.9, "step": 2.0})
    assert metrics["timing_s/step"] == 2.0
    assert metrics["timing_per_token_ms/gen"] == pytest.approx(500 / 5)
    assert metrics["timing_per_token_ms/ref"] == pytest.approx(900 / 9)


def test_throughput_counts_global_token_num_when_the_batch_records_it():
    data = batch([4, 1], [[1] * 4, [1]])
    assert compute_throughout_metrics(data, {"step": 3.0}, n_gpus=1)["perf/total_num_tokens"] == 9.0
    data.meta_info["global_token_num"] = [100, 200, 300]
    metrics = compute_throughout_metrics(data, {"step": 2.0}, n_gpus=2)
    assert metrics["perf/total_num_tokens"] == 600 and metrics["perf/throughput"] == 150.0


def test_metric_is_a_metric_list_built_from_a_first_value():
    total = Metric("sum", [1, 2])
    total.append(torch.tensor(3.0))
    total.append(Metric(AggregationType.SUM, 4.0))  # another Metric: its values are added
    assert total.values == [1, 2, 3.0, 4.0] and total.aggregate() == 10.0
    assert isinstance(total, MetricList) and isinstance(Metric.chain([total, Metric("sum", 1)]), Metric)
    per_key = Metric.from_dict({"loss": 1.5, "acc": 0.5}, aggregation="max")
    assert per_key["loss"].values == [1.5] and per_key["acc"].aggregation is AggregationType.MAX
    assert total.init_list().values == [] and isinstance(total.init_list(), Metric)
    with pytest.raises(AggregationTypeMismatchError, match="sum != mean"):
        total.append(Metric("mean", 1.0))
    with pytest.raises(ValueError, match="scalar"):
        total.append(torch.tensor([1.0, 2.0]))
    assert reduce_metrics({"m": Metric("min", [3.0, 1.0]), "plain": [2.0, 4.0]}) == {"m": 1.0, "plain": 3.0}


def test_timing_per_token_is_zero_for_a_stage_without_tokens():
    metrics = compute_timing_metrics(batch([0, 0], [[], []]), {"gen": 0.5})  # no response tokens at all
    assert metrics["timing_per_token_ms/gen"] == 0.0 and metrics["timing_s/gen"] == 0.5


def test_aggregate_dp_means_over_ranks_for_sum_and_mean_and_takes_extremes_over_all():
    # rank 0 saw micro-batches [1, 2], rank 1 [3, 5]: per micro-batch the rank mean is [2, 3.5]
    assert Metric.aggregate_dp([Metric("sum", [1.0, 2.0]), Metric("sum", [3.0, 5.0])]) == 5.5  # 2 + 3.5
    assert Metric.aggregate_dp([Metric("mean", [1.0, 2.0]), Metric("mean", [3.0, 5.0])]) == 2.75  # (2 + 3.5) / 2
    assert Metric.aggregate_dp([Metric("max", [1.0, 2.0]), Metric("max", [3.0, 5.0])]) == 5.0
    assert Metric.aggregate_dp([Metric("min", [1.0, 2.0]), Metric("min", [3.0, 5.0])]) == 1.0
    with pytest.raises(ValueError, match="same number of values"):
        Metric.aggregate_dp([Metric("sum", [1.0]), Metric("sum", [1.0, 2.0])])
    with pytest.raises(ValueError, match="empty"):
        Metric.aggregate_dp([])
    with pytest.raises(AggregationTypeMismatchError):
        Metric.aggregate_dp([Metric("sum", [1.0]), Metric("mean", [1.0])])


def test_reduce_metrics_merges_a_list_of_metric_objects_by_their_aggregation():
    # one Metric per micro-batch, as append_to_dict gathers them: partial sums add up
    gathered = {"critic/vf_loss": [Metric("sum", 0.25), Metric("sum", 0.5)], "max_x": [Metric("max", [1.0, 3.0])]}
    assert reduce_metrics(gathered) == {"critic/vf_loss": 0.75, "max_x": 3.0}
    with pytest.raises(AggregationTypeMismatchError):
        reduce_metrics({"x": [Metric("sum", 1.0), Metric("mean", 1.0)]})
    with pytest.raises(TypeError, match="cannot mix"):
        reduce_metrics({"x": [Metric("sum", 1.0), 2.0]})
    assert reduce_metrics({"x": [1.0], "empty": []}) == {"x": 1.0}  # no values: dropped, not NaN
