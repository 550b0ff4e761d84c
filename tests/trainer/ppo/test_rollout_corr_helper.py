"""Rollout correction: truncated / masked IS weights, rejection sampling, bypass mode and the mismatch metrics."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from algo_reference import assert_tight
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from verl.trainer.config import RolloutCorrectionConfig
from verl.trainer.ppo import rollout_corr_helper as rc
from verl.workers.config import PolicyLossConfig


@st.composite
def logprob_pairs(draw):
    bs, width = draw(st.integers(1, 5)), draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    rollout = -torch.rand(bs, width, generator=g, dtype=torch.float64) * 3
    train = rollout + torch.randn(bs, width, generator=g, dtype=torch.float64) * draw(st.floats(0.01, 1.0))
    mask = (torch.rand(bs, width, generator=g) < 0.75).double()
    return train, rollout, mask


def ref_weights(train, rollout, mask, level, lower, upper):
    out = []
    for t_row, r_row, m_row in zip(train.tolist(), rollout.tolist(), mask.tolist()):
        seq_log = math.fsum(t - r for t, r, m in zip(t_row, r_row, m_row) if m)
        row = []
        for t, r, m in zip(t_row, r_row, m_row):
            log_w = (t - r) if level == "token" else seq_log
            w = math.exp(max(-20.0, min(20.0, log_w))) if m else 0.0
            row.append(min(w, upper) if lower is None else (w if lower <= w <= upper else 0.0))
        out.append(row)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [1.5, "1.5", "0.8_1.25", "0.5_3.0"])
@settings(max_examples=10, deadline=None)
@given(pair=logprob_pairs())
def test_is_weights_match_reference(pair, level, threshold):
    train, rollout, mask = pair
    lower, upper = (None, 1.5) if threshold in (1.5, "1.5") else tuple(map(float, threshold.split("_")))
    weights, mask_out, metrics = rc.compute_rollout_correction_and_rejection_mask(
        train, rollout, mask, rollout_is=level, rollout_is_threshold=threshold
    )
    assert_tight(weights, ref_weights(train, rollout, mask, level, lower, upper))
    assert torch.equal(mask_out, mask)  # no rejection sampling configured
    assert all(key.startswith("rollout_corr/") for key in metrics)
    if mask.any():
        assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(float((weights * mask).sum() / mask.sum()))


def test_batch_normalization_gives_mean_one():
    train = torch.tensor([[0.0, 0.5, 0.0], [0.2, 0.0, 0.0]], dtype=torch.float64)
    rollout = torch.zeros(2, 3, dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    w, metrics = rc.compute_rollout_correction_weights(train - rollout, mask, "token", 10.0, True)
    assert float((w * mask).sum() / mask.sum()) == pytest.approx(1.0)
    assert metrics["rollout_is_batch_norm_factor"] == pytest.approx((1 + math.exp(0.5) + math.exp(0.2)) / 3)
    holes = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]])  # the second sequence starts with a masked token
    w, _ = rc.compute_rollout_correction_weights(train - rollout, holes, "sequence", 10.0, True)
    seq_w = torch.tensor([math.exp(0.5), 1.0], dtype=torch.float64)
    assert_tight(w, (seq_w / seq_w.mean()).unsqueeze(-1) * holes)  # one weight per sequence, mean 1
    assert not w.requires_grad


def ref_rs_keep(train, rollout, mask, option, lower, upper):
    """Token keep flags for one rejection option, from its definition."""
    level, est = option.rsplit("_", 1)
    keep = []
    for t_row, r_row, m_row in zip(train.tolist(), rollout.tolist(), mask.tolist()):
        ells = [max(-20.0, min(20.0, t - r)) for t, r in zip(t_row, r_row)]
        value = {"k1": lambda x: x, "k2": lambda x: 0.5 * x * x, "k3": lambda x: math.exp(x) - 1 - x}[est]
        valid = [value(x) for x, m in zip(ells, m_row) if m]

        def ok(stat):
            return math.log(lower) <= stat <= math.log(upper) if est == "k1" else stat <= upper

        if level == "token":
            keep.append([bool(m) and ok(value(x)) for x, m in zip(ells, m_row)])
            continue
        if not valid:
            seq_ok = True
        elif level == "seq_sum":
            seq_ok = ok(math.fsum(valid))
        elif level == "seq_mean":
            seq_ok = ok(math.fsum(valid) / len(valid))
        else:
            seq_ok = ok(max(valid))
        keep.append([bool(m) and seq_ok for m in m_row])
    return torch.tensor(keep, dtype=torch.float64)


@pytest.mark.parametrize("option", rc.SUPPORTED_ROLLOUT_RS_OPTIONS)
@settings(max_examples=10, deadline=None)
@given(pair=logprob_pairs())
def test_rejection_sampling_matches_reference(pair, option):
    train, rollout, mask = pair
    threshold = "0.7_1.3" if option.endswith("k1") else 0.05
    lower, upper = (0.7, 1.3) if option.endswith("k1") else (None, 0.05)
    weights, kept, metrics = rc.compute_rollout_correction_and_rejection_mask(
        train, rollout, mask, rollout_rs=option, rollout_rs_threshold=threshold
    )
    assert weights is None
    expected = ref_rs_keep(train, rollout, mask, option, lower, upper)
    assert torch.equal(kept, expected)
    if mask.any():
        rejected = float(((1 - expected) * mask).sum() / mask.sum())
        assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(rejected)


def test_rejection_options_combine_with_and_and_single_k1_bound_is_symmetric():
    train = torch.tensor([[0.0, 0.5, -0.5, 0.05]], dtype=torch.float64)
    rollout = torch.zeros(1, 4, dtype=torch.float64)
    mask = torch.ones(1, 4)
    kept, metrics = rc.compute_rollout_rejection_mask(train - rollout, mask, "token_k1,token_k2", "1.3,0.01")
    # k1 keeps r in [1/1.3, 1.3] → tokens 0 and 3; k2 = ½ℓ² <= 0.01 keeps ℓ in [−0.141, 0.141] → tokens 0 and 3.
    assert kept.tolist() == [[1.0, 0.0, 0.0, 1.0]]
    assert metrics["rollout_rs_token_k1_masked_fraction"] == 0.5
    kept, _ = rc.compute_rollout_rejection_mask(train - rollout, mask, "token_k1", 1.7)
    assert kept.tolist() == [[1.0, 1.0, 1.0, 1.0]]


def test_offpolicy_metrics_hand_worked():
    train = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], dtype=torch.float64)
    rollout = torch.tensor([[-1.5, -2.0, 0.0], [-0.5, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    m = rc.compute_offpolicy_metrics(train, rollout, mask)
    assert m["training_log_ppl"] == pytest.approx((1.5 + 0.5) / 2)
    assert m["training_ppl"] == pytest.approx((math.exp(1.5) + math.exp(0.5)) / 2)
    assert m["rollout_log_ppl"] == pytest.approx((1.75 + 0.5) / 2)
    assert m["kl"] == pytest.approx(-0.5 / 3)  # mean of log π_rollout − log π_train over 3 tokens
    assert m["k3_kl"] == pytest.approx((math.exp(0.5) - 0.5 - 1) / 3)
    assert m["log_ppl_diff"] == pytest.approx((-0.25 + 0.0) / 2)
    assert m["ppl_ratio"] == pytest.approx((math.exp(-0.25) + 1) / 2)
    assert m["chi2_token"] == pytest.approx((math.exp(1.0) + 2) / 3 - 1)
    assert m["chi2_seq"] == pytest.approx((math.exp(1.0) + 1) / 2 - 1)
    assert m["log_prob_abs_diff_mean"] == pytest.approx(0.5 / 3)
    assert m["log_prob_abs_diff_max"] == pytest.approx(0.5)
    assert rc.compute_offpolicy_metrics(train, rollout, torch.zeros(2, 3)) == {}
    prefixed = rc.compute_rollout_corr_metrics_from_logprobs(train, rollout, mask)
    assert prefixed["rollout_corr/kl"] == pytest.approx(m["kl"])


def _batch(**tensors):
    return SimpleNamespace(batch=TensorDict(tensors, batch_size=[next(iter(tensors.values())).shape[0]]))


def test_add_to_batch_updates_mask_and_adds_weights():
    train = torch.tensor([[0.0, 1.0], [0.1, 0.0]], dtype=torch.float64)
    batch = _batch(
        old_log_probs=train, rollout_log_probs=torch.zeros(2, 2, dtype=torch.float64), response_mask=torch.ones(2, 2)
    )
    cfg = RolloutCorrectionConfig(
        rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1", rollout_rs_threshold=2.0
    )
    out, metrics = rc.compute_rollout_correction_and_add_to_batch(batch, cfg)
    assert out is batch
    assert batch.batch["response_mask"].tolist() == [[1.0, 0.0], [1.0, 1.0]]  # e^1 > 2 is rejected
    assert_tight(
        batch.batch["rollout_is_weights"], torch.tensor([[1.0, 2.0], [math.exp(0.1), 1.0]], dtype=torch.float64)
    )
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.25  # 1 of the 4 tokens
    with pytest.raises(ValueError, match="rollout_log_probs"):
        rc.compute_rollout_correction_and_add_to_batch(_batch(old_log_probs=train, response_mask=train), cfg)


def test_bypass_mode():
    batch = _batch(rollout_log_probs=torch.full((2, 2), -0.5), old_log_probs=torch.zeros(2, 2))
    rc.apply_bypass_mode(batch)
    assert torch.equal(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])
    with pytest.raises(ValueError, match="calculate_log_probs"):
        rc.apply_bypass_mode(_batch(old_log_probs=torch.zeros(2, 2)))
    rc_cfg = RolloutCorrectionConfig.bypass_ppo_clip()
    derived = rc.bypass_policy_loss_config(PolicyLossConfig(), rc_cfg)
    assert derived.loss_mode == "bypass_mode" and derived.rollout_correction is rc_cfg
    rc.apply_bypass_mode(batch, rc_cfg, derived)
    with pytest.raises(ValueError, match="loss_mode='bypass_mode'"):
        rc.apply_bypass_mode(batch, rc_cfg, PolicyLossConfig())
    with pytest.raises(ValueError, match="bypass_mode=True"):
        rc.bypass_policy_loss_config(PolicyLossConfig(), RolloutCorrectionConfig())


def test_bad_arguments():
    x, m = torch.zeros(1, 2), torch.ones(1, 2)
    with pytest.raises(ValueError, match="rollout_is='tokens'"):
        rc.compute_rollout_correction_weights(x, m, "tokens")
    with pytest.raises(ValueError, match="lower bound must not exceed"):
        rc.compute_rollout_correction_weights(x, m, "token", "2.0_1.0")
    with pytest.raises(ValueError, match="unknown option"):
        rc.compute_rollout_rejection_mask(x, m, "token_k4", 1.0)
    with pytest.raises(ValueError, match="must be set"):
        rc.compute_rollout_rejection_mask(x, m, "token_k1", None)
    with pytest.raises(ValueError, match="single upper bound"):
        rc.compute_rollout_rejection_mask(x, m, "token_k2", "0.5_2")
    with pytest.raises(ValueError, match="one shared threshold or one per option"):
        rc.compute_rollout_rejection_mask(x, m, "token_k1,token_k2", "1,2,3")
