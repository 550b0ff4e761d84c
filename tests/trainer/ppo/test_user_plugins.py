"""Estimators and losses a veRL user registers, with the arguments they declare (no ``**kwargs``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.core_algos import register_adv_est
from verl.trainer.ppo.ray_trainer import compute_advantage, compute_response_mask
from verl.utils.py_functional import accepted_kwargs, call_with_accepted_kwargs, declared_parameters


def rollout(scores: list[float], uids: list[str]) -> DataProto:
    """Responses of 3 tokens (the last one padding), each sample's score at its last valid token."""
    n = len(scores)
    rewards = torch.zeros(n, 3)
    rewards[:, 1] = torch.tensor(scores)
    attention = torch.cat([torch.ones(n, 2, dtype=torch.long), torch.tensor([[1, 1, 0]] * n)], dim=1)
    return DataProto.from_dict(
        {"token_level_rewards": rewards, "responses": torch.zeros(n, 3, dtype=torch.long), "attention_mask": attention},
        {"uid": np.array(uids, dtype=object)},
    )


def mean_baseline(token_level_rewards, response_mask, index):
    """Score minus the group mean (no config, no **kwargs: veRL's call gives it only what it declares)."""
    scores = token_level_rewards.sum(-1)
    groups = {g: scores[[i for i, u in enumerate(index) if u == g]].mean() for g in set(index)}
    advantages = torch.stack([scores[i] - groups[u] for i, u in enumerate(index)])
    return advantages[:, None] * response_mask, advantages[:, None] * response_mask


@pytest.fixture
def registered_mean_baseline():
    register_adv_est("carry_over_mean_baseline")(mean_baseline)
    yield "carry_over_mean_baseline"
    del core_algos.ADV_ESTIMATOR_REGISTRY["carry_over_mean_baseline"]  # other tests list the built-in names


def test_an_estimator_without_kwargs_runs_through_compute_advantage(registered_mean_baseline):
    data = rollout([1.0, 0.0, 2.0, 2.0], ["a", "a", "b", "b"])
    compute_advantage(data, registered_mean_baseline, norm_adv_by_std_in_grpo=False, config={"gamma": 1.0})
    # response_mask was derived from the attention mask (the batch had none), as veRL does
    assert torch.equal(data.batch["response_mask"], compute_response_mask(data))
    assert data.batch["advantages"][:, 0].tolist() == [0.5, -0.5, 0.0, 0.0]
    assert data.batch["advantages"][:, 2].tolist() == [0.0] * 4  # the padding token


def test_an_estimator_added_to_the_registry_dict_directly():
    core_algos.ADV_ESTIMATOR_REGISTRY["carry_over_zero"] = lambda token_level_rewards, response_mask: (
        torch.zeros_like(token_level_rewards),
        torch.zeros_like(token_level_rewards),
    )
    try:
        data = compute_advantage(rollout([1.0, 0.0], ["a", "a"]), "carry_over_zero")
        assert data.batch["advantages"].abs().sum() == 0
    finally:
        del core_algos.ADV_ESTIMATOR_REGISTRY["carry_over_zero"]


def test_a_policy_loss_without_rollout_is_weights():
    def loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config):  # veRL's older signature
        return -(advantages * log_prob * response_mask).sum(), {"actor/my_loss": 1.0}

    ones = torch.ones(2, 3)
    value, metrics = call_with_accepted_kwargs(
        loss,
        old_log_prob=ones,
        log_prob=ones,
        advantages=ones,
        response_mask=ones,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    )
    assert float(value) == -6.0 and metrics == {"actor/my_loss": 1.0}


def test_accepted_kwargs():
    def declared(a, b=1, *, c=2):
        return a, b, c

    def takes_any(a, **kwargs):
        return a, kwargs

    assert declared_parameters(declared) == frozenset({"a", "b", "c"}) and declared_parameters(takes_any) is None
    assert accepted_kwargs(declared, {"a": 1, "c": 3, "d": 4}) == {"a": 1, "c": 3}
    assert accepted_kwargs(takes_any, {"a": 1, "d": 4}) == {"a": 1, "d": 4}
    # a missing required argument is still the function's own error
    with pytest.raises(TypeError, match=r"declared\(\) missing 1 required positional argument: 'a'"):
        call_with_accepted_kwargs(declared, c=3)
