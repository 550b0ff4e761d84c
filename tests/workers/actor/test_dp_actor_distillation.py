"""The actor's on-policy distillation term (``distillation.enabled``) against a hand-written step: the task's PPO loss
plus ``distillation_loss_coef`` × the distillation loss, the estimator on the sampled token's log-probs and the
top-k forward KL on the student's logits, with or without padding removed, in one micro-batch or several."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.workers.actor.test_dp_actor import PROMPT, config, make_actor, make_batch
from verl.workers.actor import DataParallelPPOActor
from verl.workers.config.distillation import DistillationConfig

K, COEF = 3, 0.5


def distillation(loss_mode: str) -> DistillationConfig:
    """Enabled, with the actor's side only (the teachers are the batch's ``teacher_*`` tensors here)."""
    section = {"distillation_loss": {"loss_mode": loss_mode, "topk": K, "distillation_loss_coef": COEF}}
    return DistillationConfig(enabled=True, distillation_loss=DistillationConfig.from_config(section).distillation_loss)


def with_teacher(data, loss_mode: str):
    g = torch.Generator().manual_seed(7)
    if loss_mode == "forward_kl_topk":
        logits = torch.randn(data.batch["responses"].shape + (256,), generator=g)
        top = torch.log_softmax(logits, -1).topk(K, -1)
        data.batch["teacher_ids"], data.batch["teacher_logprobs"] = top.indices, top.values
    else:
        data.batch["teacher_logprobs"] = -torch.rand(*data.batch["responses"].shape, 1, generator=g) * 5
    return data


def student(actor: DataParallelPPOActor, cfg: dict, loss_mode: str, **kwargs) -> DataParallelPPOActor:
    model = copy.deepcopy(actor.actor_module)
    return DataParallelPPOActor(
        {**cfg, **kwargs}, model, torch.optim.SGD(model.parameters(), lr=0.5), distillation=distillation(loss_mode)
    )


@pytest.mark.parametrize("loss_mode", ["k3", "forward_kl_topk"])
def test_the_update_adds_the_weighted_distillation_loss_of_a_hand_written_step(loss_mode):
    cfg = config(use_kl_loss=False, entropy_coeff=0.0, grad_clip=1e9)
    base = make_actor(cfg)
    reference = copy.deepcopy(base.actor_module)
    actor = student(base, cfg, loss_mode)
    assert actor.zero_adv_skip_reason == "on-policy distillation (distillation.enabled) reads every sample"
    data = with_teacher(make_batch(), loss_mode)
    metrics = actor.update_policy(data)
    b = data.batch
    out = reference(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
    log_dist = torch.log_softmax(out.logits[:, PROMPT - 1 : -1] / 0.7, -1)
    logp = log_dist.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - b["old_log_probs"])
    adv, mask = b["advantages"], b["response_mask"].float()
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * 3.0), per_token)
    if loss_mode == "k3":  # e^{t − s} − (t − s) − 1 on the sampled token, clamped to ±10 (veRL's low_var_kl)
        d = b["teacher_logprobs"].squeeze(-1) - logp
        distill = (torch.exp(d) - d - 1).clamp(-10, 10)
    else:  # Σ_k p_t (log p_t − log p_s) over the teacher's top-k, at least 0
        p_t = b["teacher_logprobs"]
        distill = (p_t.exp() * (p_t - log_dist.gather(-1, b["teacher_ids"]))).sum(-1).clamp_min(0)
    pg, dl = (per_token * mask).sum() / mask.sum(), (distill * mask).sum() / mask.sum()
    (pg + COEF * dl).backward()
    torch.optim.SGD(reference.parameters(), lr=0.5).step()
    assert metrics["actor/pg_loss"][0] == pytest.approx(pg.item(), rel=1e-5)
    assert metrics["actor/distillation/loss"][0] == pytest.approx(dl.item(), rel=1e-5)
    valid = distill[mask.bool()]
    assert metrics["actor/distillation/loss_max"][0] == pytest.approx(valid.max().item(), rel=1e-5)
    for (name, p), q in zip(actor.actor_module.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    if loss_mode == "forward_kl_topk":
        assert 0 < metrics["actor/distillation/student_mass"][0] < 1
        assert 0 <= metrics["actor/distillation/overlap_ratio"][0] <= 1


def test_padding_removed_and_micro_batches_give_the_same_top_k_update():
    cfg = config(use_kl_loss=False, entropy_coeff=0.0, grad_clip=1e9)
    base = make_actor(cfg)
    plain = student(base, cfg, "forward_kl_topk")
    packed = student(base, cfg, "forward_kl_topk", use_remove_padding=True, ppo_micro_batch_size_per_gpu=3)
    m1 = plain.update_policy(with_teacher(make_batch(), "forward_kl_topk"))
    m2 = packed.update_policy(with_teacher(make_batch(), "forward_kl_topk"))
    for (name, p), q in zip(plain.actor_module.named_parameters(), packed.actor_module.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)
    for key in ("actor/distillation/loss", "actor/distillation/teacher_mass", "actor/distillation/loss_min"):
        assert m1[key][0] == pytest.approx(m2[key][0], rel=1e-4), key


def test_a_batch_without_the_teachers_view_is_refused_by_name():
    cfg = config(use_kl_loss=False, entropy_coeff=0.0)
    actor = student(make_actor(cfg), cfg, "forward_kl_topk")
    with pytest.raises(KeyError, match=r"update_policy needs batch keys \['teacher_logprobs', 'teacher_ids'\]"):
        actor.update_policy(make_batch())
