"""Every advantage estimator against its loop reference (algo_reference.py) on random batches, plus edge cases."""

from __future__ import annotations

import algo_reference as ref
import numpy as np
import pytest
import torch
from algo_reference import assert_tight
from hypothesis import given, settings
from hypothesis import strategies as st

from verl.trainer.config import AlgoConfig
from verl.trainer.ppo import core_algos as ca

SETTINGS = settings(max_examples=30, deadline=None)


@st.composite
def batches(draw, min_group=1, multi_turn=None):
    """(rewards, mask, index) as float64: random group sizes in shuffled order, rows of any length (0 included),
    and, for multi-turn batches, masks with holes. Scores are discrete half the time (ties, equal groups)."""
    sizes = draw(st.lists(st.integers(min_group, 5), min_size=1, max_size=6))
    width = draw(st.integers(1, 7))
    seed = draw(st.integers(0, 2**31 - 1))
    holes = draw(st.booleans()) if multi_turn is None else multi_turn
    discrete = draw(st.booleans())
    g = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    uids = np.array([f"uid-{k}" for k, size in enumerate(sizes) for _ in range(size)], dtype=object)
    uids = uids[torch.randperm(n, generator=g).numpy()]
    if holes:
        mask = (torch.rand(n, width, generator=g) < 0.7).double()
    else:
        lengths = torch.randint(0, width + 1, (n,), generator=g)
        mask = (torch.arange(width) < lengths[:, None]).double()
    if discrete:
        rewards = torch.zeros(n, width, dtype=torch.float64)
        rewards[:, -1] = torch.randint(0, 3, (n,), generator=g).double() / 2
    else:
        rewards = torch.randn(n, width, generator=g, dtype=torch.float64)
    return rewards, mask, uids


def whitenable(mask: torch.Tensor) -> bool:
    return int(mask.sum()) >= 2


@SETTINGS
@given(batches(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_gae_matches_reference(batch, gamma, lam):
    rewards, mask, _ = batch
    if not whitenable(mask):
        return
    values = torch.randn(rewards.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    adv, ret = ca.compute_gae_advantage_return(rewards, values, mask, gamma, lam)
    ref_adv, ref_ret = ref.gae(rewards, values, mask, gamma, lam)
    assert_tight(adv, ref_adv, atol=1e-7)
    assert_tight(ret, ref_ret)


@SETTINGS
@given(batches(), st.floats(0.0, 1.0))
def test_reinforce_plus_plus_matches_reference(batch, gamma):
    rewards, mask, _ = batch
    if not whitenable(mask):
        return
    adv, ret = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config=AlgoConfig(gamma=gamma))
    ref_adv, ref_ret = ref.reinforce_plus_plus(rewards, mask, gamma)
    assert_tight(adv, ref_adv, atol=1e-7)
    assert_tight(ret, ref_ret)


@SETTINGS
@given(batches())
def test_remax_matches_reference(batch):
    rewards, mask, _ = batch
    baselines = torch.randn(rewards.shape[0], dtype=torch.float64)
    adv, ret = ca.compute_remax_outcome_advantage(rewards, baselines, mask)
    ref_adv, ref_ret = ref.remax(rewards, baselines, mask)
    assert_tight(adv, ref_adv)
    assert_tight(ret, ref_ret)


@SETTINGS
@given(batches(), st.booleans())
def test_grpo_and_dr_grpo_match_reference(batch, norm):
    rewards, mask, uids = batch
    for name in ("grpo", "grpo_vectorized"):
        adv, ret = ca.get_adv_estimator_fn(name)(rewards, mask, uids, norm_adv_by_std_in_grpo=norm)
        assert_tight(adv, ref.grpo(rewards, mask, uids, norm=norm))
        assert adv is ret


@SETTINGS
@given(batches(), st.booleans(), st.integers(1, 3))
def test_gdpo_matches_reference(batch, norm, n_keys):
    rewards, mask, uids = batch
    if not whitenable(mask):
        return
    g = torch.Generator().manual_seed(int(rewards.shape[0] * 31 + n_keys))
    components = {
        f"r{k}": torch.randint(0, 3, (rewards.shape[0],), generator=g).double().tolist() for k in range(n_keys)
    }
    weights = [0.5 + k for k in range(n_keys)]
    non_tensor = {key: np.array(values, dtype=object) for key, values in components.items()}
    non_tensor["uid"] = uids
    adv, ret = ca.compute_gdpo_outcome_advantage(
        rewards, mask, uids, norm_adv_by_std_in_grpo=norm, non_tensor_batch=non_tensor,
        config={"gdpo_reward_keys": list(components), "gdpo_reward_weights": weights},
    )  # fmt: skip
    expected = ref.gdpo(list(components.values()), weights, mask, uids, norm=norm)
    assert_tight(adv, expected, atol=1e-7)
    assert ret is adv


@SETTINGS
@given(batches(min_group=2), st.booleans())
def test_grpo_passk_matches_reference(batch, norm):
    rewards, mask, uids = batch
    adv, _ = ca.compute_grpo_passk_outcome_advantage(rewards, mask, uids, config={"norm_adv_by_std_in_grpo": norm})
    assert_tight(adv, ref.grpo_passk(rewards, mask, uids, norm=norm))


@SETTINGS
@given(batches())
def test_reinforce_plus_plus_baseline_matches_reference(batch):
    rewards, mask, uids = batch
    if not whitenable(mask):
        return
    adv, _ = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, uids)
    assert_tight(adv, ref.reinforce_plus_plus_baseline(rewards, mask, uids), atol=1e-7)


@SETTINGS
@given(batches())
def test_rloo_opo_gpg_match_reference(batch):
    rewards, mask, uids = batch
    assert_tight(ca.compute_rloo_outcome_advantage(rewards, mask, uids)[0], ref.rloo(rewards, mask, uids))
    assert_tight(
        ca.compute_rloo_vectorized_outcome_advantage(rewards, mask, uids)[0],
        ref.rloo(rewards, mask, uids, singleton_keeps_score=False),
    )
    assert_tight(ca.compute_opo_outcome_advantage(rewards, mask, uids)[0], ref.opo(rewards, mask, uids))
    assert_tight(
        ca.compute_gpg_outcome_advantage(rewards, mask, uids, f_norm=2.0)[0], ref.gpg(rewards, mask, uids, 2.0)
    )


@SETTINGS
@given(batches(), st.booleans(), st.booleans(), st.booleans())
def test_optimal_token_baselines_match_reference(batch, multi_turn, zero_tail, with_is):
    rewards, mask, uids = batch
    g = torch.Generator().manual_seed(3)
    old_log_probs = -torch.rand(rewards.shape, generator=g, dtype=torch.float64) * 3
    sum_pi_sq = torch.rand(rewards.shape, generator=g, dtype=torch.float64) * 0.8
    is_weights = torch.rand(rewards.shape, generator=g, dtype=torch.float64) * 2 if with_is else None
    name = "tir_optimal_token_baseline" if multi_turn else "optimal_token_baseline"
    adv, ret = ca.get_adv_estimator_fn(name)(
        token_level_rewards=rewards, response_mask=mask, index=uids, old_log_probs=old_log_probs,
        sum_pi_squared=sum_pi_sq, rollout_is_weights=is_weights, handle_zero_tail=zero_tail,
    )  # fmt: skip
    ref_adv, ref_ret = ref.optimal_token_baseline(
        rewards, mask, uids, old_log_probs, sum_pi_sq, is_weights, zero_tail, multi_turn=multi_turn
    )
    assert_tight(adv, ref_adv)
    assert_tight(ret, ref_ret)


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_otb_ignores_garbage_in_masked_positions(name):
    g = torch.Generator().manual_seed(5)
    rewards = torch.randn(6, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1, 0]] * 3 + [[1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]]).double()
    old_log_probs = -torch.rand(6, 5, generator=g, dtype=torch.float64)
    sum_pi_sq = torch.rand(6, 5, generator=g, dtype=torch.float64) * 0.5
    uids = np.array(["a", "a", "b", "b", "b", "a"], dtype=object)
    fn = ca.get_adv_estimator_fn(name)
    clean, _ = fn(rewards, mask, uids, old_log_probs, sum_pi_sq)
    pad = mask == 0
    dirty, _ = fn(
        rewards.masked_fill(pad, float("nan")), mask, uids, old_log_probs.masked_fill(pad, float("-inf")),
        sum_pi_sq.masked_fill(pad, float("nan")),
    )  # fmt: skip
    assert_tight(dirty, clean)


def test_otb_variants_default_to_handle_zero_tail():
    # veRL 0.10: both default to handle_zero_tail=True (optimal_token_baseline was False before).
    import inspect

    for fn in (ca.compute_optimal_token_baseline_advantage, ca.compute_multi_turn_optimal_token_baseline_advantage):
        assert inspect.signature(fn).parameters["handle_zero_tail"].default is True, fn.__name__


# ------------------------------------------------------------------------------------------------ edge cases
def test_singleton_groups():
    rewards = torch.tensor([[0.0, 2.0], [0.0, 3.0], [1.0, 0.0]])
    mask = torch.ones(2 * 3).reshape(3, 2)
    uids = np.array(["a", "b", "b"], dtype=object)
    # GRPO: a singleton uses mean 0, std 1, so its advantage is its score / (1 + eps).
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, mask, uids)
    assert adv[0].tolist() == pytest.approx([2.0 / (1 + 1e-6)] * 2, rel=1e-6)
    # RLOO keeps a singleton's score; rloo_vectorized gives it 0 (as veRL's two variants do).
    assert ca.compute_rloo_outcome_advantage(rewards, mask, uids)[0][0].tolist() == [2.0, 2.0]
    assert ca.compute_rloo_vectorized_outcome_advantage(rewards, mask, uids)[0][0].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="at least 2 samples per group.*'a'"):
        ca.compute_grpo_passk_outcome_advantage(rewards, mask, uids)


@pytest.mark.parametrize("name", ["grpo", "rloo", "opo", "gpg", "grpo_passk", "reinforce_plus_plus_baseline", "gdpo"])
def test_equal_rewards_give_exactly_zero_advantage(name):
    # Scores of 0.1 in a group of three: a naive mean (0.1+0.1+0.1)/3 != 0.1 would leak a tiny nonzero advantage
    # that the std division (std ~ 1e-17 + eps) blows up; the shifted mean keeps it exactly 0.
    rewards = torch.zeros(6, 3)
    rewards[:3, -1] = 0.1
    rewards[3:, -1] = 0.7
    mask = torch.ones(6, 3)
    uids = np.array(["p", "p", "p", "q", "q", "q"], dtype=object)
    # gdpo without reward keys (a direct call; a run's config must name them) normalises the summed token rewards
    config = AlgoConfig() if name == "gdpo" else AlgoConfig(adv_estimator=name)
    adv, _ = ca.get_adv_estimator_fn(name)(rewards, mask, uids, config=config)
    assert torch.count_nonzero(adv) == 0


def test_fully_masked_rows_get_zero_advantage():
    rewards = torch.tensor([[1.0, 2.0], [0.5, 0.5], [3.0, 0.0], [0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    uids = np.array(["a", "a", "b", "b"], dtype=object)
    for name in ["grpo", "rloo", "opo", "gpg", "grpo_passk", "reinforce_plus_plus_baseline", "gdpo"]:
        adv, _ = ca.get_adv_estimator_fn(name)(rewards, mask, uids, config=AlgoConfig())
        assert torch.all(adv[1] == 0) and torch.all(adv[3] == 0), name
    # OPO: a group whose responses are all empty has baseline 0 instead of 0/0.
    adv, _ = ca.compute_opo_outcome_advantage(rewards, torch.zeros_like(mask), uids)
    assert torch.isfinite(adv).all()


def test_bf16_inputs_keep_dtype_and_match_fp64_reference():
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(16, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(16, 5, dtype=torch.float64)
    mask[::3, 3:] = 0
    uids = np.repeat(np.arange(4), 4)
    adv, _ = ca.compute_grpo_outcome_advantage(rewards.bfloat16(), mask.bfloat16(), uids)
    assert adv.dtype == torch.bfloat16
    expected = ref.grpo(rewards.bfloat16().double(), mask, uids)
    torch.testing.assert_close(adv.double(), expected, rtol=1e-2, atol=1e-2)
    values = torch.randn(16, 5, generator=g, dtype=torch.float64)
    adv, ret = ca.compute_gae_advantage_return(rewards.bfloat16(), values.bfloat16(), mask, 0.9, 0.8)
    ref_adv, ref_ret = ref.gae(rewards.bfloat16().double(), values.bfloat16().double(), mask, 0.9, 0.8)
    assert adv.dtype == torch.bfloat16
    torch.testing.assert_close(adv.double(), ref_adv, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(ret.double(), ref_ret, rtol=2e-2, atol=2e-2)


def test_gae_hand_worked_example():
    # One response of 3 tokens, γ = 1, λ = 1, reward 1 on the last token, values [0.5, 0.5, 0.5]:
    # δ = [0, 0, 0.5]... A_2 = 1 - 0.5 = 0.5, A_1 = 0 + 0.5 = 0.5, A_0 = 0.5; returns = A + V = 1 everywhere.
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.full((1, 3), 0.5, dtype=torch.float64)
    _, ret = ca.compute_gae_advantage_return(rewards, values, torch.ones(1, 3), 1.0, 1.0)
    assert ret.tolist() == [[1.0, 1.0, 1.0]]


def test_index_accepts_ints_strings_and_tensors():
    rewards, mask = torch.randn(6, 2, dtype=torch.float64), torch.ones(6, 2)
    ids = [7, 3, 7, 3, 9, 9]
    expected = ca.compute_grpo_outcome_advantage(rewards, mask, np.array(ids))[0]
    for index in (ids, [str(i) for i in ids], np.array(ids, dtype=object), torch.tensor(ids)):
        assert_tight(ca.compute_grpo_outcome_advantage(rewards, mask, index)[0], expected)


def test_bad_inputs_raise_clear_errors():
    rewards, mask = torch.randn(4, 3), torch.ones(4, 3)
    with pytest.raises(ValueError, match="one group id per sample"):
        ca.compute_grpo_outcome_advantage(rewards, mask, ["a", "b"])
    with pytest.raises(ValueError, match="one .* shape"):
        ca.compute_grpo_outcome_advantage(rewards, torch.ones(4, 2), ["a"] * 4)
    with pytest.raises(ValueError, match="reward_baselines must have shape"):
        ca.compute_remax_outcome_advantage(rewards, torch.zeros(3), mask)
    with pytest.raises(ValueError, match="gamma must be a scalar"):
        ca.compute_gae_advantage_return(rewards, rewards, mask, torch.ones(2), 1.0)
    one_token = torch.zeros(4, 3)
    one_token[0, 0] = 1
    with pytest.raises(ValueError, match="single element"):
        ca.compute_gae_advantage_return(rewards, rewards, one_token, 1.0, 1.0)


def test_tolerance_trips_on_a_wrong_value():
    rewards, mask, uids = torch.randn(8, 4, dtype=torch.float64), torch.ones(8, 4), np.repeat(np.arange(2), 4)
    expected = ref.grpo(rewards, mask, uids)
    actual = ca.compute_grpo_outcome_advantage(rewards, mask, uids)[0]
    assert_tight(actual, expected)
    with pytest.raises(AssertionError, match="Tensor-likes are not close"):  # the values, not the shapes
        assert_tight(actual, expected * (1 + 1e-5))
