"""veRL 0.10's algorithm changes, each on a small hand-worked example: the GDPO estimator, the DPPO-Binary and DRO
policy losses, the token-sum and (new / legacy) seq-mean-token-sum-norm aggregations, REINFORCE++ through tool
tokens, the optimal-token baseline's new default, and the "+" KL estimators. Each expected value is written out as
the arithmetic that produces it, with a comment saying why."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from algo_reference import assert_tight
from omegaconf import OmegaConf

from verl.algorithms.config import LOSS_AGG_MODES
from verl.protocol import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos as ca
from verl.trainer.ppo.utils import compute_advantage
from verl.workers.config import ActorConfig

SQRT_HALF = math.sqrt(0.5)


# ------------------------------------------------------------------------------------------------ registries
def test_every_new_name_resolves():
    assert ca.AdvantageEstimator.GDPO == "gdpo"
    assert ca.get_adv_estimator_fn("gdpo") is ca.compute_gdpo_outcome_advantage
    assert ca.get_adv_estimator_fn(ca.AdvantageEstimator.GDPO) is ca.compute_gdpo_outcome_advantage
    assert ca.get_policy_loss_fn("dppo_tv") is ca.compute_policy_loss_dppo_tv
    assert ca.get_policy_loss_fn("dppo_kl") is ca.compute_policy_loss_dppo_kl
    assert ca.get_policy_loss_fn("dro") is ca.compute_policy_loss_dro
    # veRL 0.10's registered losses are all here.
    verl_losses = {"vanilla", "dppo_tv", "dppo_kl", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro"}
    assert verl_losses | {"cispo", "bypass_mode"} <= set(ca.POLICY_LOSS_REGISTRY)
    assert {"token-sum", "seq-mean-token-sum-norm", "seq-mean-token-sum-norm-legacy"} <= set(LOSS_AGG_MODES)


# ------------------------------------------------------------------------------------------------ GDPO
# Two prompts (a, b), two responses each, responses of 2 tokens plus 1 padding column. Two reward components:
#   acc = [1, 0 | 1, 1],  fmt = [1, 1 | 0, 1].
# A group of two values x ≠ y normalises to ±(|x − y|/2) / (|x − y|/√2 + ε) = ±√½ (up to ε); equal values give 0:
#   acc → [+√½, −√½ | 0, 0],  fmt → [0, 0 | −√½, +√½].
# With weights (2, 1): A = [2√½, −2√½ | −√½, +√½] = [√2, −√2 | −√½, √½]. Whitening over the 8 valid tokens (each
# value twice): mean 0, unbiased variance 2·(2 + 2 + ½ + ½)/7 = 10/7, so √2 → √2/√(10/7) = √1.4 and
# √½ → √½/√(10/7) = √0.35.
ACC, FMT = [1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0]
UIDS = np.array(["a", "a", "b", "b"], dtype=object)
MASK = torch.tensor([[1.0, 1.0, 0.0]] * 4, dtype=torch.float64)
GDPO_EXPECTED = torch.tensor([math.sqrt(1.4), -math.sqrt(1.4), -math.sqrt(0.35), math.sqrt(0.35)]).double()


def gdpo_non_tensor() -> dict[str, np.ndarray]:
    # as the trainer stores the reward function's extra outputs: object arrays, one entry per sample
    return {"acc": np.array(ACC, dtype=object), "fmt": np.array(FMT, dtype=object), "uid": UIDS}


def test_gdpo_hand_worked_weighted():
    rewards = torch.zeros(4, 3, dtype=torch.float64)  # GDPO reads the components, not the token rewards
    adv, ret = ca.compute_gdpo_outcome_advantage(
        rewards, MASK, UIDS, non_tensor_batch=gdpo_non_tensor(), gdpo_reward_keys=["acc", "fmt"],
        gdpo_reward_weights=[2.0, 1.0],
    )  # fmt: skip
    assert_tight(adv, GDPO_EXPECTED[:, None] * MASK, atol=1e-6)  # ε = 1e-6 in the group std
    assert ret is adv


def test_gdpo_equal_weights_by_default_and_keys_from_the_config():
    # Equal weights: A = [√½, −√½ | −√½, √½], all of one magnitude, so the whitened values are ±√½/√(4/7) = ±√(7/8).
    expected = torch.tensor([1.0, -1.0, -1.0, 1.0]).double() * math.sqrt(7 / 8)
    for config in ({"gdpo_reward_keys": ["acc", "fmt"]}, OmegaConf.create({"gdpo_reward_keys": ["acc", "fmt"]})):
        adv, _ = ca.compute_gdpo_outcome_advantage(
            torch.zeros(4, 3), MASK.float(), UIDS, config=config, non_tensor_batch=gdpo_non_tensor()
        )
        assert adv.dtype == torch.float32
        assert_tight(adv, expected[:, None] * MASK, atol=1e-6)


def test_gdpo_without_std_normalisation():
    # norm_adv_by_std_in_grpo=False: acc → [½, −½ | 0, 0], fmt → [0, 0 | −½, ½]; the sum has one magnitude again,
    # so the whitened values are ±√(7/8) as with equal weights.
    adv, _ = ca.compute_gdpo_outcome_advantage(
        torch.zeros(4, 3), MASK, UIDS, norm_adv_by_std_in_grpo=False, non_tensor_batch=gdpo_non_tensor(),
        gdpo_reward_keys=["acc", "fmt"],
    )  # fmt: skip
    assert_tight(adv[:, 0], torch.tensor([1.0, -1.0, -1.0, 1.0]).double() * math.sqrt(7 / 8), atol=1e-7)


def test_gdpo_through_compute_advantage():
    # The trainer's path: the estimator is looked up by name and gets the batch's non-tensor half.
    rewards = torch.zeros(4, 3)
    data = DataProto.from_dict(
        {
            "token_level_rewards": rewards,
            "response_mask": MASK.float(),
            "responses": torch.zeros(4, 3, dtype=torch.long),
            "attention_mask": torch.ones(4, 5, dtype=torch.long),
        },
        gdpo_non_tensor(),
    )
    config = {"gdpo_reward_keys": ["acc", "fmt"], "gdpo_reward_weights": [2, 1]}
    compute_advantage(data, "gdpo", config=config)
    assert_tight(data.batch["advantages"], GDPO_EXPECTED[:, None] * MASK, atol=1e-6)
    # The other estimators still run through the same call (they ignore the non-tensor batch).
    compute_advantage(data, "grpo", config=AlgoConfig(adv_estimator="grpo"))
    assert torch.count_nonzero(data.batch["advantages"]) == 0  # all token rewards are 0


def test_gdpo_direct_call_without_keys_is_whitened_grpo():
    # veRL's fallback for a call without the batch: the one component is the summed token reward.
    # Scores [1, 0 | 0, 0]: GRPO → [√½, −√½ | 0, 0]; whitening over 8 tokens: variance 2·(½ + ½)/7 = 2/7, so
    # ±√½ → ±√½/√(2/7) = ±√(7/4).
    rewards = torch.zeros(4, 3, dtype=torch.float64)
    rewards[0, 1] = 1.0
    adv, _ = ca.compute_gdpo_outcome_advantage(rewards, MASK, UIDS)
    assert_tight(adv[:, 0], torch.tensor([math.sqrt(7 / 4), -math.sqrt(7 / 4), 0.0, 0.0]).double(), atol=1e-6)


def test_gdpo_errors_name_the_problem():
    rewards, nt = torch.zeros(4, 3), gdpo_non_tensor()
    with pytest.raises(ValueError, match=r"gdpo_reward_keys names \['length'\].*non-tensor keys present"):
        ca.compute_gdpo_outcome_advantage(rewards, MASK, UIDS, non_tensor_batch=nt, gdpo_reward_keys=["acc", "length"])
    with pytest.raises(ValueError, match="GDPO needs algorithm.gdpo_reward_keys"):
        ca.compute_gdpo_outcome_advantage(rewards, MASK, UIDS, non_tensor_batch=nt, config=AlgoConfig())
    with pytest.raises(ValueError, match="needs the batch's non-tensor data"):
        ca.compute_gdpo_outcome_advantage(rewards, MASK, UIDS, gdpo_reward_keys=["acc"])
    with pytest.raises(ValueError, match="must be a list of keys"):
        ca.compute_gdpo_outcome_advantage(rewards, MASK, UIDS, non_tensor_batch=nt, gdpo_reward_keys="acc")
    with pytest.raises(ValueError, match=r"gdpo_reward_weights=\[1.0\] must be 2 finite numbers"):
        ca.compute_gdpo_outcome_advantage(
            rewards, MASK, UIDS, non_tensor_batch=nt, gdpo_reward_keys=["acc", "fmt"], gdpo_reward_weights=[1.0]
        )
    bad = dict(nt, acc=np.array([1.0, "yes", 0.0, 1.0], dtype=object))
    with pytest.raises(ValueError, match="component 'acc' must hold one number per sample"):
        ca.compute_gdpo_outcome_advantage(rewards, MASK, UIDS, non_tensor_batch=bad, gdpo_reward_keys=["acc"])
    for missing_value in (float("nan"), None):  # numpy reads None as nan
        bad = dict(nt, acc=np.array([1.0, 0.0, missing_value, 1.0], dtype=object))
        with pytest.raises(ValueError, match="component 'acc' is nan at row 2"):
            ca.compute_gdpo_outcome_advantage(rewards, MASK, UIDS, non_tensor_batch=bad, gdpo_reward_keys=["acc"])
    bad = dict(nt, acc=np.array([1.0, 0.0], dtype=object))
    with pytest.raises(ValueError, match=r"'acc' has shape \(2,\); expected one number per sample \(4,\)"):
        ca.compute_gdpo_outcome_advantage(rewards, MASK, UIDS, non_tensor_batch=bad, gdpo_reward_keys=["acc"])


# ------------------------------------------------------------------------------------------------ DPPO
# Five tokens of one response, trust-region bound δ = 0.05 on both sides, truncation c = clip_ratio_c = 3:
#   token  A   π_old  π     π − π_old  binary KL D                                   TV     KL
#   0     +1   0.5   0.6    +0.10     .5·ln(.5/.6) + .5·ln(.5/.4) ≈ 0.0204            out    in
#   1     +1   0.3   0.6    +0.30     .3·ln(.3/.6) + .7·ln(.7/.4) ≈ 0.1838            out    out
#   2     −2   0.5   0.2    −0.30     .5·ln(.5/.2) + .5·ln(.5/.8) ≈ 0.2231            out    out
#   3     −2   0.1   0.5    +0.40     (π rose: no bound for A < 0 in either region)  in     in
#   4     +1   0.5   0.53   +0.03     ≈ 0.0018                                       in     in
# A kept token contributes −A·min(π/π_old, c)·ln π; token 3's ratio 5 is truncated at 3.
OLD_P = [0.5, 0.3, 0.5, 0.1, 0.5]
NEW_P = [0.6, 0.6, 0.2, 0.5, 0.53]
DPPO_ADV = [1.0, 1.0, -2.0, -2.0, 1.0]
TOKEN_0 = -1.0 * (0.6 / 0.5) * math.log(0.6)
TOKEN_3 = 2.0 * 3.0 * math.log(0.5)
TOKEN_4 = -1.0 * (0.53 / 0.5) * math.log(0.53)
PPO_KL = sum(math.log(o) - math.log(n) for o, n in zip(OLD_P, NEW_P)) / 5


def dppo_inputs():
    old = torch.tensor([OLD_P], dtype=torch.float64).log()
    new = torch.tensor([NEW_P], dtype=torch.float64).log().requires_grad_(True)
    return old, new, torch.tensor([DPPO_ADV], dtype=torch.float64), torch.ones(1, 5)


@pytest.mark.parametrize(
    ("name", "kept", "expected_loss"),
    [
        ("dppo_tv", [3, 4], (TOKEN_3 + TOKEN_4) / 5),
        ("dppo_kl", [0, 3, 4], (TOKEN_0 + TOKEN_3 + TOKEN_4) / 5),
    ],
)
def test_dppo_hand_worked(name, kept, expected_loss):
    old, new, adv, mask = dppo_inputs()
    cfg = ActorConfig(clip_ratio=0.05, clip_ratio_low=0.05, clip_ratio_high=0.05, clip_ratio_c=3.0)
    loss, metrics = ca.get_policy_loss_fn(name)(old, new, adv, mask, "token-mean", cfg, None)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-9)
    assert metrics["actor/pg_clipfrac"] == pytest.approx((5 - len(kept)) / 5)  # tokens outside the region
    assert metrics["actor/pg_clipfrac_lower"] == pytest.approx(1 / 5)  # token 3: kept, ratio truncated
    assert metrics["actor/ppo_kl"] == pytest.approx(PPO_KL)
    # ∂L/∂ln π_t = −A·min(r, c)/5 on kept tokens and 0 elsewhere (the mask and the weight are constants).
    (grad,) = torch.autograd.grad(loss, new)
    weights = [0.6 / 0.5, 0.6 / 0.3, 0.2 / 0.5, 3.0, 0.53 / 0.5]
    expected = [-a * w / 5 if t in kept else 0.0 for t, (a, w) in enumerate(zip(DPPO_ADV, weights))]
    assert grad[0].tolist() == pytest.approx(expected, rel=1e-9)


def test_dppo_truncates_at_20_without_clip_ratio_c():
    # veRL's fallback when the config has no clip_ratio_c: token 3's ratio 5 is then below the bound and kept whole.
    old, new, adv, mask = dppo_inputs()
    loss, metrics = ca.compute_policy_loss_dppo_tv(old, new, adv, mask, "token-mean", {"clip_ratio": 0.05})
    assert loss.item() == pytest.approx((2.0 * 5.0 * math.log(0.5) + TOKEN_4) / 5, rel=1e-9)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    with pytest.raises(ValueError, match=r"actor.clip_ratio_c=0.0 must be > 0"):
        ca.compute_policy_loss_dppo_kl(old, new, adv, mask, "token-mean", {"clip_ratio_c": 0.0})


def test_dppo_uses_low_and_high_bounds_by_the_advantage_sign():
    # With δ_high = 0.35 (A > 0) token 1 (+0.30) joins token 0 inside the TV region; δ_low = 0.35 also admits
    # token 2 (−0.30, A < 0).
    old, new, adv, mask = dppo_inputs()
    high = ActorConfig(clip_ratio_low=0.05, clip_ratio_high=0.35, clip_ratio_c=3.0)
    low = ActorConfig(clip_ratio_low=0.35, clip_ratio_high=0.05, clip_ratio_c=3.0)
    for cfg, outside in ((high, 1 / 5), (low, 2 / 5)):
        _, metrics = ca.compute_policy_loss_dppo_tv(old, new, adv, mask, "token-mean", cfg)
        assert metrics["actor/pg_clipfrac"] == pytest.approx(outside)


# ------------------------------------------------------------------------------------------------ DRO
# Two tokens, β = 0.5: log π_old = [−1.0, −0.5], log π = [−0.8, −0.9], A = [2, −1]; Δ = log π − log π_old = [0.2, −0.4].
#   token 0: −(−0.8·2 − ½·0.5·0.2²) = −(−1.6 − 0.01) = 1.61
#   token 1: −(−0.9·−1 − ½·0.5·0.4²) = −(0.9 − 0.04) = −0.86
# token-mean: (1.61 − 0.86)/2 = 0.375; ppo_kl = mean(−Δ) = (−0.2 + 0.4)/2 = 0.1.
# ∂L/∂log π = (−A + β·Δ)/2 = [(−2 + 0.1)/2, (1 − 0.2)/2] = [−0.95, 0.4].
def dro_inputs():
    old = torch.tensor([[-1.0, -0.5]], dtype=torch.float64)
    new = torch.tensor([[-0.8, -0.9]], dtype=torch.float64, requires_grad=True)
    return old, new, torch.tensor([[2.0, -1.0]], dtype=torch.float64), torch.ones(1, 2)


@pytest.mark.parametrize(
    "config",
    [
        {"policy_loss": {"loss_mode": "dro", "dro_beta": 0.5}},
        OmegaConf.create({"policy_loss": {"loss_mode": "dro", "dro_beta": 0.5}}),
    ],
)
def test_dro_hand_worked(config):
    old, new, adv, mask = dro_inputs()
    loss, metrics = ca.get_policy_loss_fn("dro")(old, new, adv, mask, "token-mean", config, None)
    assert loss.item() == pytest.approx(0.375, rel=1e-12)
    assert metrics == pytest.approx({"actor/ppo_kl": 0.1})
    (grad,) = torch.autograd.grad(loss, new)
    assert grad[0].tolist() == pytest.approx([-0.95, 0.4], rel=1e-12)


def test_dro_gradient_is_that_of_the_squared_residual_over_beta():
    # DRO (arXiv:2405.19107) minimises ½·(A − β·log(π/π_old))²; its gradient is β times the per-token loss's.
    old, new, adv, mask = dro_inputs()
    beta = 0.5
    loss, _ = ca.compute_policy_loss_dro(old, new, adv, mask, "token-sum", dro_beta=beta)
    (grad,) = torch.autograd.grad(loss, new)
    (residual_grad,) = torch.autograd.grad((0.5 * (adv - beta * (new - old)) ** 2).sum(), new)
    assert_tight(residual_grad, beta * grad)


def test_dro_keeps_a_gradient_at_zero_advantage_and_needs_a_positive_beta():
    old, new, _, mask = dro_inputs()
    loss, _ = ca.compute_policy_loss_dro(old, new, torch.zeros(1, 2), mask, "token-mean", dro_beta=0.5)
    (grad,) = torch.autograd.grad(loss, new)
    assert grad[0].tolist() == pytest.approx([0.5 * 0.2 / 2, 0.5 * -0.4 / 2])  # β·Δ/2: not inert at A = 0
    for config, beta in [(ActorConfig(), None), ({"policy_loss": {"dro_beta": 0.0}}, None), (None, -1.0)]:
        with pytest.raises(ValueError, match=r"actor.policy_loss.dro_beta=.* must be a number > 0"):
            ca.compute_policy_loss_dro(old, new, torch.zeros(1, 2), mask, "token-mean", config, dro_beta=beta)


# ------------------------------------------------------------------------------------------------ agg_loss
# Two sequences: token losses [1, 2, (pad)] and [3, (pad), (pad)]; ℓ = [3, 3], 3 valid tokens, width 3.
LOSS = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]])
LOSS_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def test_token_sum():
    assert float(ca.agg_loss(LOSS, LOSS_MASK, "token-sum")) == 1 + 2 + 3
    # each of 2 ranks scales its local sum by dp_size: the rank-average of the gradients is the global sum
    assert float(ca.agg_loss(LOSS, LOSS_MASK, "token-sum", dp_size=2)) == (1 + 2 + 3) * 2


def test_seq_mean_token_sum_norm_new_and_legacy():
    # new: seq-mean-token-sum (3 + 3)/2 = 3, divided by the factor (default the width 3, here also 4)
    assert float(ca.agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm")) == pytest.approx((3 + 3) / 2 / 3)
    assert float(ca.agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm", loss_scale_factor=4)) == pytest.approx(
        6 / 2 / 4
    )
    # legacy (before veRL 0.8): all token losses summed, divided by the factor, no mean over the sequences
    assert float(ca.agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm-legacy")) == pytest.approx(6 / 3)
    legacy = ca.agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm-legacy", dp_size=2, loss_scale_factor=4)
    assert float(legacy) == pytest.approx(6 * 2 / 4)
    with pytest.raises(ValueError, match="loss_scale_factor=0 must be > 0"):
        ca.agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm-legacy", loss_scale_factor=0)


def test_the_actor_config_accepts_the_new_modes_and_losses_reduce_with_them():
    for mode in ("token-sum", "seq-mean-token-sum-norm-legacy"):
        assert ActorConfig(loss_agg_mode=mode).loss_agg_mode == mode
    # gpg's token loss −A·log π = [1, 2 | 3] with A = −1 and log π = [1, 2 | 3]: token-sum gives 6.
    loss, _ = ca.compute_policy_loss_gpg(LOSS, LOSS, -torch.ones(2, 3), LOSS_MASK, "token-sum", ActorConfig())
    assert float(loss) == 6.0


# ------------------------------------------------------------------------------------------------ REINFORCE++
def test_reinforce_plus_plus_passes_the_return_through_tool_tokens():
    # Turn 1 = tokens 0–1, a tool output at token 2 (mask 0, with a stray reward 5 that must not count), turn 2 =
    # tokens 3–4 with the final reward 1 on token 4, then 1 padding token; γ = 0.5:
    #   G4 = 1,  G3 = 0 + 0.5·1 = 0.5,  G2 = 0 (masked; the running 0.5 passes through undiscounted),
    #   G1 = 0 + 0.5·0.5 = 0.25,  G0 = 0.125,  G5 = 0 (padding).
    rewards = torch.tensor([[0.0, 0.0, 5.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    adv, ret = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=AlgoConfig(gamma=0.5))
    assert ret[0].tolist() == [0.125, 0.25, 0.0, 0.5, 1.0, 0.0]
    valid = [0.125, 0.25, 0.5, 1.0]
    mean = sum(valid) / 4
    std = math.sqrt(sum((g - mean) ** 2 for g in valid) / 3 + 1e-8)  # unbiased, as masked_whiten
    expected = [(0.125 - mean) / std, (0.25 - mean) / std, 0.0, (0.5 - mean) / std, (1.0 - mean) / std, 0.0]
    assert adv[0].tolist() == pytest.approx(expected, rel=1e-12)


# ------------------------------------------------------------------------------------------------ OTB
def test_otb_defaults_to_handle_zero_tail_and_accepts_extra_keywords():
    # Group of two: lengths 3 and 1. Past the shorter one's length the longer trajectory has no peer; with
    # handle_zero_tail its baseline there is 0, so A = G on tokens 1 and 2.
    rewards = torch.tensor([[0.0, 0.0, 1.0], [2.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    uids = np.array(["a", "a"], dtype=object)
    old_log_probs, sum_pi_sq = torch.full((2, 3), math.log(0.5), dtype=torch.float64), torch.full((2, 3), 0.5).double()
    for fn in (ca.compute_optimal_token_baseline_advantage, ca.compute_multi_turn_optimal_token_baseline_advantage):
        default, _ = fn(rewards, mask, uids, old_log_probs, sum_pi_sq, unused_trainer_keyword=1)
        explicit, _ = fn(rewards, mask, uids, old_log_probs, sum_pi_sq, handle_zero_tail=True)
        assert_tight(default, explicit)
        assert default[0, 1:].tolist() == [1.0, 1.0]  # G_1 = G_2 = 1, no baseline
        assert inspect.signature(fn).parameters["handle_zero_tail"].default is True


# ------------------------------------------------------------------------------------------------ KL "+"
def test_kl_plus_suffix_picks_the_base_estimator_forward_and_k2_gradient():
    # Δ = log π − log π_ref = 0.5. k1 = 0.5; k3 = e^{−0.5} + 0.5 − 1; the gradient of k2 = ½Δ² is Δ = 0.5.
    ref_logp = torch.tensor([[-1.0]], dtype=torch.float64)
    for name, forward in [
        ("k1+", 0.5),
        ("kl+", 0.5),
        ("k3+", math.exp(-0.5) - 0.5),
        ("low_var_kl+", math.exp(-0.5) - 0.5),
    ]:
        logp = torch.tensor([[-0.5]], dtype=torch.float64, requires_grad=True)
        value = ca.kl_penalty(logp, ref_logp, name)
        (grad,) = torch.autograd.grad(value.sum(), logp)
        assert value.item() == pytest.approx(forward, rel=1e-12), name
        assert float(grad) == pytest.approx(0.5, rel=1e-12), name
