"""Zero-advantage samples skip the gradient pass: the same loss, gradient and step as the unskipped update.

A real tiny Qwen2 in one process (the 2-rank FSDP2 case, where ranks must agree on the passes, is in
``tests/workers/test_fsdp_workers.py``). SGD, not Adam, as in ``test_dp_actor.py``: Adam would turn the last-bit
noise of a near-zero gradient into full-size steps and make a parameter comparison meaningless.
"""

from __future__ import annotations

import pytest
import torch

from tests.workers.actor.test_dp_actor import BATCH, config, make_actor, make_ragged_batch
from verl.base_config import omega_conf_to_dataclass
from verl.protocol import DataProto
from verl.workers.actor import dp_actor
from verl.workers.actor.zero_adv import zero_adv_skip_reason, zero_advantage_rows
from verl.workers.config.actor import ActorConfig

ZERO_ROWS = [0, 2, 3, 6]  # two GRPO groups of equal rewards, one empty response (row 7) among the others
RTOL = 1e-6


def skip_config(**overrides) -> dict:
    return config(use_kl_loss=False, entropy_coeff=0.0, ppo_micro_batch_size_per_gpu=3, grad_clip=1e9, **overrides)


def grpo_batch(on_policy: bool) -> DataProto:
    data = make_ragged_batch()
    b = data.batch
    b["advantages"][ZERO_ROWS] = 0.0
    b["advantages"] *= b["response_mask"]
    if on_policy:
        data.meta_info["old_log_prob_in_update"] = True
        data.pop(batch_keys=["old_log_probs"])
    else:  # old log-probs near the policy's own, so the ratio is not 1 and some tokens clip
        with torch.no_grad():
            current, _ = make_actor(skip_config()).compute_log_prob(data)
        noise = torch.randn(current.shape, generator=torch.Generator().manual_seed(3)) * 0.3
        b["old_log_probs"] = current + noise
    return data


def update(skip: bool, data: DataProto, **overrides) -> tuple[dict, dp_actor.DataParallelPPOActor, list]:
    actor = make_actor(skip_config(skip_zero_advantage_samples=skip, **overrides))
    grads: list[torch.Tensor] = []
    step = actor.engine.clip_grad_norm_and_step

    def record_then_step(max_norm=None):
        grads.extend(p.grad.detach().clone() for p in actor.actor_module.parameters())
        return step(max_norm)

    actor.engine.clip_grad_norm_and_step = record_then_step
    metrics = actor.update_policy(data)
    return metrics, actor, grads


def assert_close_rel(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> None:
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a.detach(), e.detach(), rtol=RTOL, atol=RTOL * float(e.detach().abs().max()))


@pytest.mark.parametrize("on_policy", [True, False], ids=["on_policy", "old_log_probs"])
@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"use_remove_padding": True, "loss_agg_mode": "seq-mean-token-sum-norm"},
        {"policy_loss": {"loss_mode": "gspo"}},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 12, "loss_agg_mode": "seq-mean-token-mean"},
        {"calculate_entropy": True},
    ],
    ids=["vanilla", "trim_seq_sum_norm", "gspo", "dynamic_bsz", "entropy_metric"],
)
def test_skip_gives_the_unskipped_loss_gradient_and_step(on_policy, overrides):
    expected, reference, expected_grads = update(False, grpo_batch(on_policy), **overrides)
    metrics, actor, grads = update(True, grpo_batch(on_policy), **overrides)
    assert metrics["actor/zero_adv_skip_frac"] == [len(ZERO_ROWS + [7]) / BATCH]  # row 7 has no tokens
    assert "actor/zero_adv_skip_frac" not in expected
    if on_policy:  # the ratio is exactly 1 on both sides: the loss is the same sum of the same numbers
        assert metrics["actor/pg_loss"] == expected["actor/pg_loss"]
    else:  # the kept rows' log-probs come from a smaller forward: the same up to the order of float sums
        assert metrics["actor/pg_loss"][0] == pytest.approx(expected["actor/pg_loss"][0], rel=RTOL)
    assert metrics["actor/grad_norm"][0] == pytest.approx(expected["actor/grad_norm"][0], rel=RTOL)
    assert_close_rel(grads, expected_grads)
    assert_close_rel(list(actor.actor_module.parameters()), list(reference.actor_module.parameters()))
    for key in ("actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy"):
        if key in expected:
            assert metrics[key][0] == pytest.approx(expected[key][0], rel=1e-5, abs=1e-7), key
    if on_policy:  # the skipped rows' old log-probs and entropys come from their no-grad pass
        for key, value in reference.on_policy_outputs.items():
            torch.testing.assert_close(actor.on_policy_outputs[key], value, rtol=0, atol=1e-6)


def test_a_wrong_normaliser_trips_the_check(monkeypatch):
    """Counting only the trained samples' tokens would scale the loss and gradient up: the check above sees it."""
    expected, _, expected_grads = update(False, grpo_batch(True))
    kept = [row for row in range(BATCH) if row not in ZERO_ROWS]
    real = dp_actor.global_counts
    monkeypatch.setattr(dp_actor, "global_counts", lambda mask: real(mask[kept]))
    metrics, _, grads = update(True, grpo_batch(True))
    assert metrics["actor/pg_loss"] != expected["actor/pg_loss"]
    with pytest.raises(AssertionError):
        assert_close_rel(grads, expected_grads)


def test_an_all_zero_batch_still_steps_on_zero_gradients():
    """No sample trains, yet the optimizer steps on zero gradients as the unskipped update does (with momentum or
    weight decay that step moves the weights; with no gradients at all it would not)."""
    data = grpo_batch(False)
    data.batch["advantages"].zero_()
    expected, reference, _ = update(False, data)
    data = grpo_batch(False)
    data.batch["advantages"].zero_()
    metrics, actor, grads = update(True, data)
    assert metrics["actor/zero_adv_skip_frac"] == [(BATCH - 1) / BATCH]  # one sample joins to make the gradients
    assert metrics["actor/grad_norm"] == expected["actor/grad_norm"] == [0.0]
    assert all(g is not None and not g.any() for g in grads)
    assert metrics["actor/pg_loss"] == expected["actor/pg_loss"]


def test_when_the_skip_is_off():
    assert zero_adv_skip_reason(omega_conf_to_dataclass(skip_config(), ActorConfig)) is None
    base = skip_config()
    for overrides, reason in [
        ({"skip_zero_advantage_samples": False}, "skip_zero_advantage_samples=false"),
        ({"use_kl_loss": True}, "KL loss"),
        ({"entropy_coeff": 0.01}, "entropy bonus"),
        ({"policy_loss": {"loss_mode": "clip_cov"}}, "'clip_cov' is not one of"),
    ]:
        actor = make_actor({**base, **overrides})
        assert reason in actor.zero_adv_skip_reason
        assert "actor/zero_adv_skip_frac" not in actor.update_policy(grpo_batch(False))


def test_zero_advantage_rows():
    adv = torch.tensor([[0.0, 0.0], [0.0, 1.0], [2.0, 0.0], [float("nan"), 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [0, 1], [1, 1]])
    assert zero_advantage_rows(adv, mask).tolist() == [True, False, True, False]
