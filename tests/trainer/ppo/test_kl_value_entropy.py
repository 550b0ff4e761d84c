"""KL estimators and controllers, value and entropy losses, compute_rewards, PF-PPO resampling, the registries."""

from __future__ import annotations

import math
from types import SimpleNamespace

import algo_reference as ref
import numpy as np
import pytest
import torch
from algo_reference import assert_tight
from tensordict import TensorDict

from verl.trainer.config import KLControlConfig
from verl.trainer.ppo import core_algos as ca


# ------------------------------------------------------------------------------------------------ KL
def test_kl_estimators_hand_worked():
    logp, ref_logp = torch.tensor([-1.0, -30.0]), torch.tensor([-1.5, 0.0])
    delta = logp - ref_logp  # [0.5, -30]
    assert ca.kl_penalty(logp, ref_logp, "kl").tolist() == delta.tolist()
    assert ca.kl_penalty(logp, ref_logp, "abs").tolist() == [0.5, 30.0]
    assert ca.kl_penalty(logp, ref_logp, "mse").tolist() == [0.125, 450.0]
    k3 = ca.kl_penalty(logp, ref_logp, "low_var_kl")
    assert float(k3[0]) == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    assert float(k3[1]) == 10.0  # e^{20} − 20 − 1 after clamping −Δ to 20, then clamped to 10
    for alias, name in (("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")):
        assert torch.equal(ca.kl_penalty(logp, ref_logp, alias), ca.kl_penalty(logp, ref_logp, name))


def test_kl_penalty_errors():
    x = torch.zeros(2)
    with pytest.raises(NotImplementedError, match="kl_penalty='full'"):
        ca.kl_penalty(x, x, "full")
    with pytest.raises(ValueError, match="not a KL estimator"):
        ca.kl_penalty(x, x, "k4")
    with pytest.raises(ValueError, match="'\\+' suffix"):
        ca.kl_penalty_forward(x, x, "k3+")


def test_kl_controllers():
    fixed = ca.get_kl_controller(KLControlConfig(kl_coef=0.05))
    fixed.update(current_kl=10.0, n_steps=100)
    assert isinstance(fixed, ca.FixedKLController) and fixed.value == 0.05
    adaptive = ca.get_kl_controller({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.5, "horizon": 1000})
    adaptive.update(current_kl=0.6, n_steps=100)  # error 0.2 → ×(1 + 0.2·100/1000)
    assert adaptive.value == pytest.approx(0.1 * 1.02)
    adaptive.update(current_kl=50.0, n_steps=100)  # error clipped to 0.2
    assert adaptive.value == pytest.approx(0.1 * 1.02 * 1.02)
    with pytest.raises(ValueError, match="kl_ctrl.type='pid'"):
        ca.get_kl_controller({"type": "pid"})
    with pytest.raises(ValueError, match="horizon"):
        ca.get_kl_controller({"type": "adaptive", "horizon": 0})
    with pytest.raises(ValueError, match="target_kl"):
        ca.AdaptiveKLController(0.1, target_kl=0.0, horizon=10)


def test_compute_rewards():
    scores, old, reference = torch.tensor([[1.0, 2.0]]), torch.tensor([[-1.0, -2.0]]), torch.tensor([[-1.5, -1.0]])
    assert ca.compute_rewards(scores, old, reference, 0.1)[0].tolist() == pytest.approx([0.95, 2.1])


# ------------------------------------------------------------------------------------------------ value / entropy
def test_value_loss_matches_hand_computation():
    vpreds = torch.tensor([[1.0, 0.0, 5.0]], dtype=torch.float64, requires_grad=True)
    values = torch.tensor([[0.0, 0.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[0.5, 1.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, clipfrac = ca.compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    # token 0: v=1 → clipped 0.2: max(0.25, 0.09) = 0.25; token 1: v=0, max(1, 1) = 1; token 2 masked.
    assert_tight(loss, 0.5 * (0.25 + 1.0) / 2)
    assert float(clipfrac) == 0.0 and not clipfrac.requires_grad
    loss.backward()
    assert_tight(vpreds.grad, torch.tensor([[0.5 * 2 * 0.5 / 2, 0.5 * 2 * -1.0 / 2, 0.0]], dtype=torch.float64))
    # token 0: v=−1, R=−2: (v − R)² = 1 but v_clip = −0.2 gives 3.24, so the clipped error counts; token 1: 0.
    vpreds2 = torch.tensor([[-1.0, 0.0, 0.0]], dtype=torch.float64)
    returns2 = torch.tensor([[-2.0, 0.0, 0.0]], dtype=torch.float64)
    loss2, clipfrac2 = ca.compute_value_loss(vpreds2, returns2, values, mask, 0.2, dp_size=2, batch_num_tokens=4)
    assert_tight(loss2, 0.5 * 3.24 / 4 * 2)
    assert float(clipfrac2) == 0.5


def test_entropy_loss():
    logits = torch.tensor([[[0.0, 0.0], [100.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # entropies: ln2, ~0, ln2 (masked entry ignored) → token-mean 2·ln2/3
    assert float(ca.compute_entropy_loss(logits, mask)) == pytest.approx(2 * math.log(2) / 3, abs=1e-6)


# ------------------------------------------------------------------------------------------------ PF-PPO
def _data(scores):
    n = len(scores)
    batch = TensorDict(
        {"token_level_scores": torch.tensor(scores).unsqueeze(-1), "ids": torch.arange(n)}, batch_size=[n]
    )
    return SimpleNamespace(
        batch=batch,
        non_tensor_batch={"uid": np.array([f"u{i}" for i in range(n)], dtype=object)},
        meta_info={"per_sample": list(range(n)), "temperature": 1.0},
    )


def test_pf_ppo_resamples_consistently():
    data = _data([0.0, 1.0, -2.0, 0.5])
    out = ca.compute_pf_ppo_reweight_data(data, "pow", 2.0, generator=torch.Generator().manual_seed(0))
    ids = out.batch["ids"].tolist()
    assert len(ids) == 4 and out.batch.batch_size == torch.Size([4])
    assert out.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in ids]
    assert out.meta_info["per_sample"] == ids and out.meta_info["temperature"] == 1.0
    assert data.batch["ids"].tolist() == [0, 1, 2, 3]  # input untouched


def test_pf_ppo_weights():
    scores = torch.tensor([0.0, 1.0, -2.0, 0.5], dtype=torch.float64)
    from verl.trainer.ppo.pf_ppo import compute_pf_ppo_weights as w

    assert_tight(w(scores, "pow", 2.0), torch.tensor([0.0, 1.0, 4.0, 0.25], dtype=torch.float64) + 1e-8)
    assert_tight(w(scores, "max_min"), torch.tensor([0.0, 1.0, 1.0, 0.0], dtype=torch.float64) + 1e-8)
    assert_tight(w(scores, "max_random"), torch.tensor([0.1, 0.4, 0.1, 0.1], dtype=torch.float64) + 1e-8)
    with pytest.raises(ValueError, match="reweight_method='top'"):
        w(scores, "top")
    # Sampling only ever picks the extremes under max_min.
    out = ca.compute_pf_ppo_reweight_data(_data([0.0, 1.0, -2.0, 0.5] * 8), "max_min")
    picked = set(out.batch["token_level_scores"].squeeze(-1).tolist())
    assert picked <= {1.0, -2.0}


# ------------------------------------------------------------------------------------------------ registries
def test_registries_hold_every_veRL_name():
    assert {e.value for e in ca.AdvantageEstimator} == set(ca.ADV_ESTIMATOR_REGISTRY)
    assert {"vanilla", "gspo", "sapo", "gpg", "cispo", "clip_cov", "kl_cov", "geo_mean", "bypass_mode"} <= set(
        ca.POLICY_LOSS_REGISTRY
    )
    assert ca.get_adv_estimator_fn(ca.AdvantageEstimator.GRPO) is ca.get_adv_estimator_fn("grpo_vectorized")
    assert ca.get_policy_loss_fn("vanilla") is ca.compute_policy_loss_vanilla


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(ValueError, match="Unknown advantage estimator simply: grp .*'grpo'"):
        ca.get_adv_estimator_fn("grp")
    with pytest.raises(ValueError, match="unknown policy loss 'ppo'.*'vanilla'"):
        ca.get_policy_loss_fn("ppo")


def test_registering_a_different_function_under_a_taken_name_fails():
    def my_estimator(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, token_level_rewards

    with pytest.raises(ValueError, match="'grpo' is already registered"):
        ca.register_adv_est("grpo")(my_estimator)
    with pytest.raises(ValueError, match="'vanilla' is already registered"):
        ca.register_policy_loss("vanilla")(my_estimator)
    with pytest.raises(ValueError, match="non-empty string"):
        ca.register_adv_est("")
    # Same function twice is fine; a new name works and can be looked up, then is removed again.
    ca.register_adv_est("grpo")(ca.compute_grpo_outcome_advantage)
    try:
        assert ca.register_adv_est("test_only_estimator")(my_estimator) is my_estimator
        assert ca.get_adv_estimator_fn("test_only_estimator") is my_estimator
    finally:
        ca.ADV_ESTIMATOR_REGISTRY.pop("test_only_estimator", None)


def test_swapping_core_algos_registry_redirects_register_and_lookup(monkeypatch):
    from verl.algorithms import registry

    def doubled(x):
        return 2 * x

    swapped = {"gae": doubled}
    monkeypatch.setattr(ca, "ADV_ESTIMATOR_REGISTRY", swapped)
    assert ca.get_adv_estimator_fn("gae")(5) == 10
    assert ca.register_adv_est("swapped_only")(doubled) is doubled
    assert set(swapped) == {"gae", "swapped_only"}
    assert "swapped_only" not in registry.ADV_ESTIMATOR_REGISTRY  # the package's dict is untouched
    assert registry.get_adv_estimator_fn("gae") is ca.compute_gae_advantage_return
    with pytest.raises(ValueError, match=r"Unknown advantage estimator simply: grpo .*: \['gae', 'swapped_only'\]"):
        ca.get_adv_estimator_fn("grpo")


def test_reference_helpers_are_what_the_tests_think():
    # A guard on the loop reference itself: GRPO on a hand-worked group.
    rewards = torch.tensor([[1.0], [3.0]], dtype=torch.float64)
    adv = ref.grpo(rewards, torch.ones(2, 1), ["a", "a"], epsilon=0.0)
    assert adv.squeeze(-1).tolist() == pytest.approx([-1 / math.sqrt(2), 1 / math.sqrt(2)])
