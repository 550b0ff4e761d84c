"""The rollout's MoE load-balance metrics and speculative-decoding acceptance, on hand-built routing records."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from verl.trainer.ppo.metric_utils import (
    RolloutMoELoadBalanceMetricsAccumulator,
    compute_moe_lb_metrics,
    compute_rollout_moe_load_balance_metrics,
    compute_spec_decode_metrics,
    get_metric_data_with_optional_routed_experts,
    infer_moe_num_experts,
    infer_rollout_moe_num_experts,
)


def _routed(layer0: list[int], layer1: list[int], prompt_len: int = 2) -> torch.Tensor:
    """[1, prompt_len + len(layer0), 2 layers, top_k 1]; prompt positions hold expert 1 (must not be counted)."""
    response = torch.tensor([layer0, layer1]).T  # [response_len, layers]
    prompt = torch.ones(prompt_len, 2, dtype=torch.long)
    return torch.cat([prompt, response]).reshape(1, -1, 2, 1)


def test_moe_violations_count_response_tokens_except_each_sequences_last():
    # response positions 0..3, mask keeps 0..2; position 2 is the last valid one (never routed) and 3 is padding.
    # Counted: layer 0 experts {0, 1} → even: violation 0; layer 1 experts {0, 0} → shares [1, 0] → 2*share-1 = [1, -1]
    routed = _routed([0, 1, 1, 1], [0, 0, 1, 1])
    mask = torch.tensor([[1, 1, 1, 0]])
    metrics = compute_rollout_moe_load_balance_metrics(routed, mask, num_experts=2)
    assert metrics["rollout/moe/max_vio/layer_0"] == 0.0 and metrics["rollout/moe/avg_vio/layer_0"] == 0.0
    assert metrics["rollout/moe/max_vio/layer_1"] == 1.0 and metrics["rollout/moe/min_vio/layer_1"] == -1.0
    assert metrics["rollout/moe/avg_vio/layer_1"] == 1.0  # mean of |1| and |-1|
    assert metrics["rollout/moe/max_vio/max"] == 1.0 and metrics["rollout/moe/avg_vio/avg"] == 0.5
    assert compute_rollout_moe_load_balance_metrics(routed, mask, num_experts=1) == {}  # id 1 is out of range


def test_moe_accumulator_sums_counts_until_popped():
    accumulator = RolloutMoELoadBalanceMetricsAccumulator(model_config={"hf_config": {"n_routed_experts": 2}})
    mask = torch.tensor([[1, 1, 1]])  # two counted positions per update
    assert accumulator.update(_routed([0, 0, 0], [0, 1, 0]), mask)
    assert accumulator.update(_routed([1, 1, 0], [0, 1, 0]), mask)
    assert accumulator.total_assignments() == 8  # 2 updates × 2 tokens × 2 layers
    metrics = accumulator.pop_metrics()
    assert metrics["rollout/moe/max_vio/layer_0"] == 0.0  # experts 0, 0, 1, 1 over both updates
    assert accumulator.total_assignments() == 0 and accumulator.compute() == {}
    assert not RolloutMoELoadBalanceMetricsAccumulator().update(_routed([0, 0], [0, 0]), torch.ones(1, 2))


def test_infer_moe_num_experts_reads_num_local_experts_only_where_it_is_global():
    assert infer_moe_num_experts({"text_config": {"num_experts": 6}}) == 6
    assert infer_moe_num_experts({"model_type": "mixtral", "num_local_experts": 8}) == 8
    assert infer_moe_num_experts({"model_type": "other", "num_local_experts": 8}) is None


def test_infer_rollout_moe_num_experts_reads_the_hf_config_with_its_overrides(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mixtral", "num_local_experts": 4}))
    assert infer_rollout_moe_num_experts({"path": str(tmp_path)}) == 4
    overridden = {"path": str(tmp_path), "override_config": {"model_config": {"num_local_experts": 8}}}
    assert infer_rollout_moe_num_experts(overridden) == 8
    assert infer_rollout_moe_num_experts({}) is None


def test_compute_moe_lb_metrics_reports_only_at_the_interval():
    accumulator = RolloutMoELoadBalanceMetricsAccumulator(model_config={"num_experts": 2})
    batch = SimpleNamespace(batch={"routed_experts": _routed([0, 1, 0], [1, 0, 0]), "response_mask": torch.ones(1, 3)})
    assert compute_moe_lb_metrics(batch, moe_lb_metrics_interval=2, global_steps=1, accumulator=accumulator) == {}
    metrics = compute_moe_lb_metrics(batch, moe_lb_metrics_interval=2, global_steps=2, accumulator=accumulator)
    assert metrics["rollout/moe/routed_expert_assignments"] == 8  # 2 steps × 2 counted tokens × 2 layers
    assert metrics["rollout/moe/max_vio/max"] == 0.0  # each layer saw experts 0 and 1 equally


def test_routed_experts_request_falls_back_and_waits_an_interval_when_the_store_lacks_them():
    calls = []

    def get(keys, partition_id, select_fields):
        calls.append(list(select_fields))
        if "routed_experts" in select_fields:
            raise ValueError("no field routed_experts")
        return "data"

    accumulator = RolloutMoELoadBalanceMetricsAccumulator()
    for step in (1, 2, 4):
        assert get_metric_data_with_optional_routed_experts(["k"], "train", ["a"], 3, step, accumulator, get) == "data"
    # step 1 tries and falls back; step 2 < 1 + 3 does not ask; step 4 asks again
    assert calls == [["a", "routed_experts"], ["a"], ["a"], ["a", "routed_experts"], ["a"]]


def test_spec_decode_metrics_average_per_sample_and_skip_samples_without_drafts():
    # sample 0: 2 of 4 drafted tokens accepted over 2 verify steps; sample 1 drafted nothing; sample 2: 2 of 2 in 1
    metrics = compute_spec_decode_metrics([4, 0, 2], [2, 0, 2], [2, 0, 1])
    assert metrics["rollout/spec_accept_rate"] == pytest.approx((0.5 + 1.0) / 2)
    assert metrics["rollout/spec_accept_length"] == pytest.approx((2.0 + 3.0) / 2)  # 1 + accepted / verify steps
    padded = compute_spec_decode_metrics([4, 2], [2, 0], [2, 1], non_padding_mask=[True, False])
    assert padded == {"rollout/spec_accept_rate": 0.5, "rollout/spec_accept_length": 2.0}
    assert compute_spec_decode_metrics(None, None, None) == {}
    with pytest.raises(ValueError, match="spec_verifies=None"):
        compute_spec_decode_metrics([1], [1], None)


def test_hf_config_overrides_unwrap_model_config_and_plain_containers():
    from omegaconf import DictConfig, OmegaConf

    from verl.trainer.ppo.metric_utils import get_hf_config_override_kwargs

    nested = get_hf_config_override_kwargs(OmegaConf.create({"model_config": {"text_config": {"a": 1}}}))
    assert nested == {"text_config": {"a": 1}} and not isinstance(nested["text_config"], DictConfig)
    assert get_hf_config_override_kwargs({"a": 1}) == {"a": 1} and get_hf_config_override_kwargs(None) == {}
