"""Every policy loss against its loop reference, the gradient properties the papers rely on, and robustness."""

from __future__ import annotations

import algo_reference as ref
import pytest
import torch
from algo_reference import assert_tight
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from verl.algorithms.config import LOSS_AGG_MODES
from verl.trainer.config import RolloutCorrectionConfig
from verl.trainer.ppo import core_algos as ca
from verl.workers.config import ActorConfig, PolicyLossConfig

SETTINGS = settings(max_examples=25, deadline=None)
MODES = list(LOSS_AGG_MODES)
METRIC_KEYS = {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}


@st.composite
def policy_batches(draw):
    """(old_log_prob, log_prob, advantages, mask) in float64 with ratios spread over the clip range."""
    bs, width = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    old = -torch.rand(bs, width, generator=g, dtype=torch.float64) * 4
    new = old + torch.randn(bs, width, generator=g, dtype=torch.float64) * 0.4
    adv = torch.randn(bs, width, generator=g, dtype=torch.float64) * 2
    mask = (torch.rand(bs, width, generator=g) < 0.8).double()
    mask[0, 0] = 1.0  # at least one valid token
    return old, new, adv, mask


def actor(**kw) -> ActorConfig:
    return ActorConfig(**kw)


def loss_config(name: str, **policy_loss) -> ActorConfig | dict:
    """An actor config selecting loss ``name``. DRO's β (``policy_loss.dro_beta``) is not a PolicyLossConfig field
    yet, so DRO gets a plain dict config, which every loss accepts."""
    if name == "dro":
        return {"policy_loss": {"loss_mode": "dro", "dro_beta": 0.1}}
    return actor(policy_loss=PolicyLossConfig(loss_mode=name, **policy_loss))


def metric_keys(name: str) -> set[str]:
    """The metrics loss ``name`` returns: the three standard ones, or only ``actor/ppo_kl`` for DRO (as veRL)."""
    return {"actor/ppo_kl"} if name == "dro" else METRIC_KEYS


@SETTINGS
@given(policy_batches(), st.sampled_from(MODES), st.floats(0.05, 0.4), st.floats(0.05, 0.4), st.booleans())
def test_vanilla_matches_reference(batch, mode, low, high, with_weights):
    old, new, adv, mask = batch
    weights = torch.rand(old.shape, dtype=torch.float64) * 2 if with_weights else None
    cfg = actor(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=2.5)
    loss, metrics = ca.compute_policy_loss_vanilla(old, new, adv, mask, mode, cfg, weights)
    assert_tight(loss, ref.vanilla(old, new, adv, mask, mode, low, high, 2.5, weights))
    assert set(metrics) == METRIC_KEYS and all(isinstance(v, float) for v in metrics.values())


@SETTINGS
@given(policy_batches(), st.floats(0.05, 0.4), st.floats(0.05, 0.4))
def test_gspo_sapo_cispo_gpg_geo_mean_match_reference(batch, low, high):
    old, new, adv, mask = batch
    cfg = actor(clip_ratio_low=low, clip_ratio_high=high, tau_pos=1.3, tau_neg=0.9)
    assert_tight(
        ca.compute_policy_loss_gspo(old, new, adv, mask, config=cfg)[0], ref.gspo(old, new, adv, mask, low, high)
    )
    assert_tight(
        ca.compute_policy_loss_sapo(old, new, adv, mask, config=cfg)[0], ref.sapo(old, new, adv, mask, 1.3, 0.9)
    )
    for mode in MODES:
        assert_tight(
            ca.compute_policy_loss_gpg(old, new, adv, mask, mode, cfg)[0], ref.gpg_loss(old, new, adv, mask, mode)
        )
        assert_tight(
            ca.compute_policy_loss_cispo(old, new, adv, mask, mode, cfg)[0],
            ref.cispo(old, new, adv, mask, mode, low, high),
        )
    # GMPO averages over the micro-batch's sequences whatever the mode.
    assert_tight(
        ca.compute_policy_loss_geo_mean(old, new, adv, mask, config=cfg)[0],
        ref.geo_mean(old, new, adv, mask, low, high),
    )


@SETTINGS
@given(policy_batches(), st.sampled_from(MODES), st.floats(0.01, 0.4), st.floats(0.01, 0.4), st.booleans())
def test_dppo_and_dro_match_reference(batch, mode, low, high, with_weights):
    old, new, adv, mask = batch
    new = new.clamp(max=0.0)  # probabilities: the binary KL needs π ≤ 1
    weights = torch.rand(old.shape, dtype=torch.float64) * 2 if with_weights else None
    cfg = actor(clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=1.5)
    for divergence in ("tv", "kl"):
        loss, metrics = ca.get_policy_loss_fn(f"dppo_{divergence}")(old, new, adv, mask, mode, cfg)
        assert_tight(loss, ref.dppo(old, new, adv, mask, divergence, mode, low, high, 1.5))
        assert set(metrics) == METRIC_KEYS
    loss, metrics = ca.compute_policy_loss_dro(old, new, adv, mask, mode, {"policy_loss": {"dro_beta": high}}, weights)
    assert_tight(loss, ref.dro(old, new, adv, mask, high, mode, weights))
    assert set(metrics) == {"actor/ppo_kl"}


@SETTINGS
@given(policy_batches(), st.floats(0.01, 0.5), st.floats(0.0, 1.0))
def test_kl_cov_matches_reference(batch, ratio, coef):
    old, new, adv, mask = batch
    n_valid = int(mask.sum())
    k = max(1, int(n_valid * ratio))
    covs = sorted((c for row in ref.covariance(adv, new, mask) for c in row if c is not None), reverse=True)
    assume(k == n_valid or covs[k - 1] - covs[k] > 1e-9)  # the top-k set must not hinge on a tie
    cfg = actor(policy_loss=PolicyLossConfig(loss_mode="kl_cov", kl_cov_ratio=ratio, ppo_kl_coef=coef))
    loss, metrics = ca.compute_policy_loss_kl_cov(old, new, adv, mask, "token-mean", cfg)
    assert_tight(loss, ref.kl_cov(old, new, adv, mask, "token-mean", ratio, coef))
    assert metrics["actor/pg_clipfrac"] == pytest.approx(k / n_valid)


@SETTINGS
@given(policy_batches())
def test_clip_cov_detaches_only_candidate_tokens(batch):
    old, new, adv, mask = batch
    new = new.clone().requires_grad_(True)
    # A wide covariance window and ratio 1: every candidate (valid, not clipped by PPO) is detached.
    cfg = actor(
        policy_loss=PolicyLossConfig(loss_mode="clip_cov", clip_cov_ratio=1.0, clip_cov_lb=-1e9, clip_cov_ub=1e9)
    )
    loss, metrics = ca.compute_policy_loss_clip_cov(old, new, adv, mask, "token-mean", cfg)
    loss.backward()
    ratio = torch.exp(new.detach() - old)
    ppo_clipped = (-adv * ratio.clamp(0.8, 1.2)) > (-adv * ratio)
    candidates = (mask > 0) & ~ppo_clipped
    # Loss: only the PPO-clipped tokens remain; their clipped loss has zero gradient w.r.t. log π.
    expected = ref.agg(torch.where(ppo_clipped & (mask > 0), -adv * ratio.clamp(0.8, 1.2), 0.0), mask, "token-mean")
    assert_tight(loss, expected)
    assert torch.count_nonzero(new.grad) == 0
    assert metrics["actor/pg_clipfrac"] == pytest.approx(float(candidates.sum() / mask.sum()))


def test_clip_cov_detaches_the_configured_fraction():
    torch.manual_seed(0)
    old = -torch.rand(20, 50, dtype=torch.float64)
    new = (old + 0.01 * torch.randn(20, 50, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(20, 50, dtype=torch.float64) * 3
    mask = torch.ones(20, 50)
    cfg = actor(
        policy_loss=PolicyLossConfig(loss_mode="clip_cov", clip_cov_ratio=0.01, clip_cov_lb=0.0, clip_cov_ub=5.0)
    )
    loss, metrics = ca.compute_policy_loss_clip_cov(old, new, adv, mask, "token-mean", cfg)
    loss.backward()
    detached = new.grad == 0
    assert int(detached.sum()) == 10  # int(0.01 * 1000) tokens, all inside the (0, 5) covariance window
    cov = (adv - adv.mean()) * (new.detach() - new.detach().mean())
    assert bool(((cov[detached] > 0) & (cov[detached] < 5)).all())
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.01)


# ------------------------------------------------------------------------------------------------ gradients
def test_cispo_gradient_stops_at_the_clipped_weight():
    old = torch.tensor([[-1.0, -1.0, -1.0]], dtype=torch.float64)
    new = torch.tensor([[-0.5, -1.0, -1.6]], dtype=torch.float64, requires_grad=True)  # r = e^.5, 1, e^-.6
    adv = torch.tensor([[1.0, 2.0, -1.0]], dtype=torch.float64)
    loss, _ = ca.compute_policy_loss_cispo(old, new, adv, torch.ones(1, 3), "token-mean", actor())
    loss.backward()
    weight = torch.exp(new.detach() - old).clamp(0.8, 1.2)
    # ∂L/∂log π_t = −w_t·A_t / N with w treated as a constant; through w there would be an extra −A·log π·∂w term.
    assert_tight(new.grad, -weight * adv / 3)


def test_gspo_gradient_is_the_sequence_ratio_spread_over_tokens():
    old = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-1.0, -1.0, -1.0, -1.0]], dtype=torch.float64)
    new = (old + torch.tensor([[0.1, -0.05, 0.02, 0.0], [0.3, 0.3, 0.3, 0.3]])).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.5] * 4, [2.0] * 4], dtype=torch.float64)
    cfg = actor(clip_ratio_low=0.2, clip_ratio_high=0.2)
    loss, metrics = ca.compute_policy_loss_gspo(old, new, adv, mask, config=cfg)
    loss.backward()
    s0 = torch.exp(torch.tensor((0.1 - 0.05 + 0.02) / 3))  # inside [0.8, 1.2]: unclipped
    # Sequence 0: L = mean_t(−A·s) over 3 tokens, seq-mean over 2 sequences → ∂/∂log π_t = −A·s/3/2.
    expected_row0 = torch.tensor([-1.5 * s0 / 3 / 2] * 3 + [0.0], dtype=torch.float64)
    assert_tight(new.grad[0], expected_row0)
    # Sequence 1: s = e^0.3 > 1.2 with A > 0: the clipped (constant) branch wins, so no gradient.
    assert torch.count_nonzero(new.grad[1]) == 0
    assert metrics["actor/pg_clipfrac"] == pytest.approx(4 / 7)


@pytest.mark.parametrize("base", ["kl", "k1", "abs", "low_var_kl", "k3", "mse", "k2"])
def test_straight_through_kl_has_the_forward_of_its_base_and_the_gradient_of_k2(base):
    logp = (torch.randn(4, 5, dtype=torch.float64) - 1).requires_grad_(True)
    ref_logp = torch.randn(4, 5, dtype=torch.float64) - 1
    plus = ca.kl_penalty(logp, ref_logp, base + "+")
    assert_tight(plus, ca.kl_penalty(logp, ref_logp, base))
    (grad_plus,) = torch.autograd.grad(plus.sum(), logp)
    (grad_k2,) = torch.autograd.grad(ca.kl_penalty(logp, ref_logp, "k2").sum(), logp)
    assert_tight(grad_plus, grad_k2)
    assert_tight(grad_k2, (logp - ref_logp).detach())


# ------------------------------------------------------------------------------------------------ contract
@pytest.mark.parametrize("name", sorted(set(ca.POLICY_LOSS_REGISTRY) - {"bypass_mode"}))
def test_every_loss_ignores_garbage_in_masked_positions(name):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 6, generator=g, dtype=torch.float64) * 3
    new = (old + 0.2 * torch.randn(3, 6, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv = torch.randn(3, 6, generator=g, dtype=torch.float64)
    mask = torch.ones(3, 6)
    mask[:, 4:] = 0
    mask[2] = 0  # a fully masked row
    cfg = loss_config(name, clip_cov_ratio=0.5, kl_cov_ratio=0.5)
    torch.manual_seed(0)
    clean, clean_metrics = ca.get_policy_loss_fn(name)(old, new, adv, mask, "token-mean", cfg, None)
    (clean_grad,) = torch.autograd.grad(clean, new)
    poison = mask == 0
    old_p = old.masked_fill(poison, float("nan"))
    new_p = new.detach().masked_fill(poison, float("-inf")).requires_grad_(True)
    adv_p = adv.masked_fill(poison, float("inf"))
    torch.manual_seed(0)
    dirty, dirty_metrics = ca.get_policy_loss_fn(name)(old_p, new_p, adv_p, mask, "token-mean", cfg, None)
    (dirty_grad,) = torch.autograd.grad(dirty, new_p)
    assert_tight(dirty, clean)
    assert_tight(dirty_grad, clean_grad)
    assert dirty_metrics == pytest.approx(clean_metrics)
    assert metric_keys(name) <= set(clean_metrics)


@pytest.mark.parametrize("name", sorted(set(ca.POLICY_LOSS_REGISTRY) - {"bypass_mode"}))
def test_extreme_log_probs_give_finite_loss_and_gradients(name):
    old = torch.tensor([[-1e3, -0.1, -50.0, 0.0]], dtype=torch.float64)
    new = torch.tensor([[-0.1, -1e3, -1e-6, -80.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[3.0, -3.0, 1.0, -1.0]], dtype=torch.float64)
    cfg = loss_config(name)
    loss, metrics = ca.get_policy_loss_fn(name)(old, new, adv, torch.ones(1, 4), "token-mean", cfg, None)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(new.grad).all()
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values())


@pytest.mark.parametrize("name", ["vanilla", "gspo", "cispo", "sapo"])
def test_bf16_log_probs_give_an_fp32_loss_close_to_the_fp64_one(name):
    g = torch.Generator().manual_seed(2)
    old = -torch.rand(4, 8, generator=g, dtype=torch.float64) * 2
    new = old + 0.1 * torch.randn(4, 8, generator=g, dtype=torch.float64)
    adv, mask = torch.randn(4, 8, generator=g, dtype=torch.float64), torch.ones(4, 8)
    fn = ca.get_policy_loss_fn(name)
    expected, _ = fn(
        old.bfloat16().double(), new.bfloat16().double(), adv.bfloat16().double(), mask, "token-mean", actor()
    )
    new_bf16 = new.bfloat16().requires_grad_(True)
    loss, _ = fn(old.bfloat16(), new_bf16, adv.bfloat16(), mask.bfloat16(), "token-mean", actor())
    loss.backward()
    assert loss.dtype == torch.float32 and new_bf16.grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-6)


def test_losses_accept_dict_and_dictconfig_configs():
    from omegaconf import OmegaConf

    old, new, adv = torch.zeros(2, 3), torch.full((2, 3), 0.5), torch.ones(2, 3)
    plain = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
    expected = ca.compute_policy_loss_vanilla(old, new, adv, torch.ones(2, 3), config=actor(clip_ratio_high=0.28))[0]
    for cfg in (plain, OmegaConf.create(plain), None):
        loss = ca.compute_policy_loss_vanilla(old, new, adv, torch.ones(2, 3), config=cfg)[0]
        # None → veRL defaults (ε_high 0.2): r = e^0.5 is clipped at 1.2 instead of 1.28.
        assert float(loss) == pytest.approx(-1.2 if cfg is None else float(expected))


def test_vanilla_hand_worked_dual_clip():
    # A = −1, r = e^2 ≈ 7.39: PPO loss max(7.39, 1.2) = 7.39 is capped by the dual clip at −A·c = 3.
    old, new, adv = torch.zeros(1, 1), torch.full((1, 1), 2.0), -torch.ones(1, 1)
    loss, metrics = ca.compute_policy_loss_vanilla(old, new, adv, torch.ones(1, 1), config=actor())
    assert float(loss) == pytest.approx(3.0)
    assert metrics == {"actor/pg_clipfrac": 0.0, "actor/ppo_kl": -2.0, "actor/pg_clipfrac_lower": 1.0}


def test_global_batch_info_reaches_agg_loss():
    old, new, adv, mask = torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3)
    cfg = actor(global_batch_info={"dp_size": 2, "batch_num_tokens": 24})
    loss, _ = ca.compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", cfg)
    assert float(loss) == pytest.approx(-6 / 24 * 2)  # local sum −6, 24 tokens globally, ×dp
    loss, _ = ca.compute_policy_loss_gpg(old, new, adv, mask, "seq-mean-token-sum-norm", actor(loss_scale_factor=10))
    assert float(loss) == pytest.approx(0.0)


def test_bypass_mode_dispatches_on_loss_type():
    g = torch.Generator().manual_seed(1)
    rollout = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 2
    new = (rollout + 0.3 * torch.randn(4, 5, generator=g, dtype=torch.float64)).requires_grad_(True)
    adv, mask = torch.randn(4, 5, generator=g, dtype=torch.float64), torch.ones(4, 5)
    ppo_rc = RolloutCorrectionConfig(
        bypass_mode=True, loss_type="ppo_clip", rollout_rs="token_k1", rollout_rs_threshold=1.3
    )
    cfg = actor(policy_loss=PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=ppo_rc))
    loss, metrics = ca.compute_policy_loss_bypass_mode(rollout, new, adv, mask, "token-mean", cfg)
    ratio = torch.exp(new.detach() - rollout)
    kept = ((ratio >= 1 / 1.3) & (ratio <= 1.3)).double()
    assert_tight(loss, ref.vanilla(rollout, new, adv, kept))
    masked = metrics["rollout_corr/rollout_rs_masked_fraction"]
    assert 0 < masked < 1 and masked == pytest.approx(1 - float(kept.mean()))
    # the PPO metrics are the clipped loss's on the tokens left in (old = rollout)
    _, on_kept = ca.compute_policy_loss_vanilla(rollout, new.detach(), adv, kept, "token-mean", actor())
    assert 0 < metrics["actor/pg_clipfrac"] < 1 and metrics["actor/pg_clipfrac"] == on_kept["actor/pg_clipfrac"]

    pg_rc = RolloutCorrectionConfig(
        bypass_mode=True, loss_type="reinforce", rollout_is="token", rollout_is_threshold=1.5
    )
    cfg = actor(policy_loss=PolicyLossConfig(loss_mode="bypass_mode", rollout_correction=pg_rc))
    loss, _ = ca.compute_policy_loss_bypass_mode(rollout, new, adv, mask, "seq-mean-token-sum", cfg)
    weights = ratio.clamp(max=1.5)
    expected = ref.agg(-adv * new.detach() * weights, mask, "seq-mean-token-sum")
    assert_tight(loss, expected)
    with pytest.raises(ValueError, match="policy_loss.rollout_correction"):
        ca.compute_policy_loss_bypass_mode(rollout, new, adv, mask, "token-mean", actor())


def test_deprecated_compute_policy_loss_returns_the_vanilla_four_tuple():
    old, new, adv, mask = torch.zeros(2, 2), torch.full((2, 2), 0.5), -torch.ones(2, 2), torch.ones(2, 2)
    with pytest.warns(DeprecationWarning):
        loss, clipfrac, ppo_kl, lower = ca.compute_policy_loss(old, new, adv, mask, cliprange=0.2)
    expected, metrics = ca.compute_policy_loss_vanilla(old, new, adv, mask, config=actor())
    assert float(loss) == pytest.approx(float(expected))
    assert float(ppo_kl) == pytest.approx(metrics["actor/ppo_kl"]) and float(lower) == 0.0
    with pytest.raises(ValueError, match="cliprange"), pytest.warns(DeprecationWarning):
        ca.compute_policy_loss(old, new, adv, mask)


def test_bad_config_values_raise():
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ca.compute_policy_loss_vanilla(x, x, x, torch.ones(1, 2), config={"clip_ratio_c": 0.5})
    with pytest.raises(ValueError, match="tau_pos"):
        ca.compute_policy_loss_sapo(x, x, x, torch.ones(1, 2), config={"tau_pos": 0.0})
    with pytest.raises(ValueError, match="kl_cov_ratio"):
        ca.compute_policy_loss_kl_cov(x, x, x, torch.ones(1, 2), config={"policy_loss": {"kl_cov_ratio": 2.0}})
    with pytest.raises(ValueError, match="one .* shape"):
        ca.compute_policy_loss_vanilla(x, x, torch.zeros(2, 2), torch.ones(1, 2))


def test_tolerance_trips_on_a_wrong_value():
    old, new, adv, mask = (
        torch.zeros(2, 2, dtype=torch.float64),
        torch.full((2, 2), 0.1),
        torch.ones(2, 2),
        torch.ones(2, 2),
    )
    loss = ca.compute_policy_loss_vanilla(old, new.double(), adv.double(), mask, config=actor())[0]
    expected = ref.vanilla(old, new.double(), adv.double(), mask)
    assert_tight(loss, expected)
    with pytest.raises(AssertionError, match="Scalars are not close"):  # the values, not the shapes
        assert_tight(loss, expected * (1 + 1e-5))
