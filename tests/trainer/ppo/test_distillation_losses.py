"""On-policy distillation's losses (veRL 0.10's ``verl.trainer.distillation.losses``) against hand computations:
each estimator, the top-k forward KL with its masses and overlap, the clamps, the direct and the policy-gradient
reductions, the combination with the task loss, and their gradients."""

from __future__ import annotations

import math

import pytest
import torch

from verl.trainer.distillation import losses as L

MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # three valid tokens
ACTOR = {"loss_agg_mode": "token-mean", "global_batch_info": {"dp_size": 1, "batch_num_tokens": 3}}


def section(**loss) -> dict:
    return {"enabled": True, "distillation_loss": {"loss_mode": "k3", **loss}}


def test_the_veRL_path_is_the_module_and_every_loss_is_registered():
    import verl.algorithms.distillation as impl

    assert L is impl
    assert sorted(L.DISTILLATION_LOSS_REGISTRY) == sorted([*L.ESTIMATORS, "forward_kl_topk"])
    assert L.get_distillation_loss_settings("forward_kl_topk").use_topk
    assert L.get_distillation_loss_settings("k3").use_estimator
    with pytest.raises(ValueError, match=r"loss_mode='nope' is not a registered distillation loss"):
        L.get_distillation_loss_fn("nope")
    with pytest.raises(ValueError, match="exactly one of use_topk, use_estimator"):
        L.DistillationLossSettings(names="x")
    with pytest.raises(ValueError, match=r"\['k3'\] is already registered"):
        L.register_distillation_loss(L.DistillationLossSettings(names=["k3"], use_estimator=True))(lambda *a: a)
    assert L.is_distillation_enabled({"enabled": True}) and not L.is_distillation_enabled(None)


@pytest.mark.parametrize(
    ("mode", "by_hand"),
    [
        ("k1", lambda d: d),
        ("kl", lambda d: d),
        ("abs", lambda d: abs(d)),
        ("k2", lambda d: 0.5 * d * d),
        ("mse", lambda d: 0.5 * d * d),
        ("k3", lambda d: math.exp(-d) + d - 1),
        ("low_var_kl", lambda d: math.exp(-d) + d - 1),
    ],
)
def test_each_estimator_is_its_formula_on_the_sampled_token(mode, by_hand):
    student = torch.tensor([[-1.0, -0.5, -3.0], [-2.0, -9.0, -9.0]])
    teacher = torch.tensor([[-1.5, -0.25, -1.0], [-0.5, -9.0, -9.0]]).unsqueeze(-1)  # (bs, T, 1): k = 1
    losses, metrics = L.get_distillation_loss_fn(mode)(
        ACTOR, section(loss_mode=mode), {"log_probs": student}, {"teacher_logprobs": teacher, "response_mask": MASK}
    )
    deltas = (student - teacher.squeeze(-1)).tolist()
    expected = [[by_hand(d) for d in row] for row in deltas]
    assert torch.allclose(losses, torch.tensor(expected), atol=1e-6)
    valid = [expected[0][0], expected[0][1], expected[1][0]]
    assert metrics["distillation/abs_loss"] == pytest.approx(sum(abs(v) for v in valid) / 3)


def test_forward_kl_over_the_teachers_top_k_by_hand_with_masses_overlap_and_gradient():
    logits = torch.tensor([[[2.0, 1.0, 0.0, -1.0]]], requires_grad=True)  # one position, vocabulary of 4
    teacher_ids = torch.tensor([[[1, 3]]])
    teacher_lp = torch.log(torch.tensor([[[0.6, 0.3]]]))  # the teacher's top-2 hold 0.9 of its mass
    out = L.compute_forward_kl_topk(logits, teacher_lp, teacher_ids, section(loss_mode="forward_kl_topk"))
    q = torch.softmax(logits.detach()[0, 0], -1).tolist()
    kl = 0.6 * (math.log(0.6) - math.log(q[1])) + 0.3 * (math.log(0.3) - math.log(q[3]))
    assert out["distillation_losses"].item() == pytest.approx(kl, abs=1e-6)
    assert out["student_mass"].item() == pytest.approx(q[1] + q[3], abs=1e-6)
    assert out["teacher_mass"].item() == pytest.approx(0.9, abs=1e-6)
    # the student's top-2 are tokens 0 and 1: one of the teacher's two overlaps, its −p_t(log p_t − log p_s)
    assert out["overlap_count"].item() == 1
    assert out["overlap_token_advantage"].item() == pytest.approx(-0.6 * (math.log(0.6) - math.log(q[1])), abs=1e-6)
    # d/dz_v Σ_k p_k (log p_k − log softmax(z)_k) = (Σ_k p_k) q_v − p_v  (p_v = 0 off the top-k)
    out["distillation_losses"].sum().backward()
    expected = [0.9 * q[0], 0.9 * q[1] - 0.6, 0.9 * q[2], 0.9 * q[3] - 0.3]
    assert torch.allclose(logits.grad[0, 0], torch.tensor(expected), atol=1e-6)
    # the chunked path is the same numbers
    chunked = L.compute_forward_kl_topk(
        logits.detach(), teacher_lp, teacher_ids, section(use_chunked_topk=True, chunked_topk_chunk_size=1)
    )
    assert torch.allclose(chunked["distillation_losses"], out["distillation_losses"].detach())


def test_the_registered_top_k_loss_clamps_at_zero_and_reports_veRLs_metrics():
    model_output = {
        "distillation_losses": torch.tensor([[0.5, -0.2, 7.0], [0.1, 0.0, 0.0]]),
        "student_mass": torch.tensor([[0.9, 0.8, 0.0], [0.7, 0.0, 0.0]]),
        "teacher_mass": torch.tensor([[0.95, 0.9, 0.0], [0.85, 0.0, 0.0]]),
        "overlap_count": torch.tensor([[2, 0, 2], [1, 0, 0]]),
        "overlap_token_advantage": torch.tensor([[-0.2, 0.0, -5.0], [-0.4, 0.0, 0.0]]),
    }
    data = {"response_mask": MASK, "teacher_ids": torch.zeros(2, 3, 2, dtype=torch.long)}
    losses, metrics = L.forward_kl_topk(ACTOR, section(loss_mode="forward_kl_topk"), model_output, data)
    assert losses[0, 1].item() == 0.0 and losses[0, 0].item() == 0.5  # negative over a part of the vocabulary: 0
    assert metrics["distillation/student_mass"] == pytest.approx(0.8)
    assert metrics["distillation/student_mass_min"] == pytest.approx(0.7)
    assert metrics["distillation/teacher_mass_max"] == pytest.approx(0.95)
    assert metrics["distillation/overlap_ratio"] == pytest.approx((2 + 0 + 1) / 3 / 2)
    assert metrics["distillation/overlap_token_advantage"] == pytest.approx((-0.2 - 0.4) / 2)  # where they overlap


def test_the_direct_loss_is_the_token_mean_after_the_clamps_and_k1_is_refused():
    student = torch.tensor([[-1.0, -4.0, -3.0], [-0.2, -9.0, -9.0]], requires_grad=True)
    teacher = torch.tensor([[-3.0, -1.0, 0.0], [-0.7, 0.0, 0.0]])
    data = {"teacher_logprobs": teacher, "response_mask": MASK}
    cfg = section(loss_mode="k2", loss_max_clamp=1.5, log_prob_min_clamp=-3.5)
    loss, metrics = L.distillation_loss(ACTOR, cfg, {"log_probs": student}, data)
    # k2 = ½Δ²: Δ = 2, then −3.5 − (−1) = −2.5 (the student's −4 floored at −3.5), then 0.5
    raw = [0.5 * 4.0, 0.5 * 6.25, 0.5 * 0.25]
    assert metrics["distillation/loss_min"] == pytest.approx(min(raw))
    assert metrics["distillation/loss_max"] == pytest.approx(max(raw))
    assert loss.item() == pytest.approx((1.5 + 1.5 + 0.125) / 3)  # each token's loss clamped to ±1.5, token-mean
    loss.backward()  # the clamped tokens and the floored log-prob pass no gradient; Δ / 3 for the third
    assert torch.allclose(student.grad, torch.tensor([[0.0, 0.0, 0.0], [0.5 / 3, 0.0, 0.0]]), atol=1e-6)
    with pytest.raises(ValueError, match="k1 with use_policy_gradient=false: the gradient of k1 does not depend"):
        L.distillation_loss(ACTOR, section(loss_mode="k1"), {"log_probs": student}, data)


def test_policy_gradient_mode_uses_the_negative_loss_as_advantage_in_a_clipped_ppo_loss():
    old = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    student = torch.tensor([[-0.5, -1.5, 0.0], [-1.1, 0.0, 0.0]], requires_grad=True)
    teacher = torch.tensor([[-1.0, -1.0, 0.0], [-2.0, 0.0, 0.0]])
    data = {"teacher_logprobs": teacher, "response_mask": MASK, "old_log_probs": old}
    cfg = section(loss_mode="k1", use_policy_gradient=True, clip_ratio_low=0.2, clip_ratio_high=0.3)
    loss, metrics = L.distillation_loss(ACTOR, cfg, {"log_probs": student}, data)
    tokens = [(0, 0), (0, 1), (1, 0)]
    advantages = [-(student[i, t].item() - teacher[i, t].item()) for i, t in tokens]  # −k1, detached: −0.5, 0.5, 0.9
    ratios = [math.exp(student[i, t].item() - old[i, t].item()) for i, t in tokens]  # 1.65, 1.65, 0.90
    unclipped = [-a * r for a, r in zip(advantages, ratios, strict=True)]
    clipped = [-a * min(max(r, 0.8), 1.3) for a, r in zip(advantages, ratios, strict=True)]
    # PPO's clipped surrogate (the dual clip, at −A·3, does not bind here)
    assert loss.item() == pytest.approx(sum(map(max, unclipped, clipped)) / 3, abs=1e-6)
    assert metrics["distillation/pg_clipfrac"] == pytest.approx(1 / 3)  # the second token: A > 0, r > 1.3
    assert "distillation/ppo_kl" in metrics and "distillation/abs_loss" in metrics
    loss.backward()  # the clipped token passes no gradient; the others −A·r / 3
    grads = [0.0 if c > u else -a * r / 3 for a, r, u, c in zip(advantages, ratios, unclipped, clipped, strict=True)]
    assert grads[1] == 0.0
    expected = torch.tensor([[grads[0], grads[1], 0.0], [grads[2], 0.0, 0.0]])
    assert torch.allclose(student.grad, expected, atol=1e-6)


def test_the_actor_loss_adds_the_weighted_distillation_term_or_is_it_alone():
    student = torch.tensor([[-1.0, -2.0, 0.0], [-1.0, 0.0, 0.0]])
    data = {"teacher_logprobs": torch.tensor([[-1.0, -1.0, 0.0], [-2.0, 0.0, 0.0]]), "response_mask": MASK}
    distill, _ = L.distillation_loss(ACTOR, section(), {"log_probs": student}, data)
    policy = torch.tensor(0.25)
    total, metrics = L.distillation_ppo_loss(
        policy, ACTOR, section(distillation_loss_coef=0.5), {"log_probs": student}, data
    )
    assert total.item() == pytest.approx(0.25 + 0.5 * distill.item()) and metrics["distillation/loss"] == distill.item()
    alone, _ = L.distillation_ppo_loss(
        policy, ACTOR, section(use_task_rewards=False, distillation_loss_coef=0.5), {"log_probs": student}, data
    )
    assert alone.item() == pytest.approx(distill.item())  # the coefficient applies beside task rewards only


def test_the_distillation_section_resolves_its_teachers_and_names_every_mistake(caplog):
    from omegaconf import OmegaConf

    from verl.trainer.config.compose import compose_config
    from verl.workers.config.distillation import DistillationConfig

    base = compose_config("ppo_trainer").distillation
    assert DistillationConfig.from_config(base) == DistillationConfig(n_gpus_per_node=8)  # off: nothing resolved
    one = OmegaConf.merge(base, {"enabled": True, "n_gpus_per_node": 2, "nnodes": 1})
    one.teacher_models.teacher_model.model_path = "/t"
    config = DistillationConfig.from_config(one)
    (teacher,) = config.teacher_models.values()
    assert (teacher.key, teacher.num_replicas) == ("default", 2)  # the single teacher fills the pool
    assert config.route("anything") is teacher and config.distillation_loss.teacher_logprobs_k == 0
    two = OmegaConf.merge(
        one,
        {
            "teacher_models": {
                "math": {"key": "gsm8k", "model_path": "/m", "num_replicas": 1},
                "code": {"key": "apps", "model_path": "/c", "num_replicas": 1},
            },
            "distillation_loss": {"loss_mode": "forward_kl_topk", "topk": 4},
        },
    )
    with caplog.at_level("WARNING"):
        config = DistillationConfig.from_config(two)
    assert "teacher_models.teacher_model (model_path=/t) is dropped" in caplog.text
    assert config.route("apps").model_path == "/c" and config.distillation_loss.teacher_logprobs_k == 4
    with pytest.raises(ValueError, match=r"a sample's value 'wiki' names no teacher; teachers: \['apps', 'gsm8k'\]"):
        config.route("wiki")
    mistakes = {
        "teacher pool distillation.n_gpus_per_node=0": {"n_gpus_per_node": 0},
        "teachers' replicas take 2 device\\(s\\), the teacher pool .* has 4": {"n_gpus_per_node": 4},
        "loss_mode=k1 with use_policy_gradient=false": {"distillation_loss": {"loss_mode": "k1"}},
        "'nope' is not a registered distillation loss": {"distillation_loss": {"loss_mode": "nope"}},
        "unknown key\\(s\\) \\['topp'\\]": {"distillation_loss": {"topp": 3}},
        "teacher_models.code.model_path is not set": {"teacher_models": {"code": {"model_path": None}}},
    }
    for message, change in mistakes.items():
        with pytest.raises(ValueError, match=message):
            DistillationConfig.from_config(OmegaConf.merge(two, change))
