"""DataParallelPPOActor in one process on a real tiny Qwen2 (the 2-rank FSDP2 case is in the worker tests)."""

from __future__ import annotations

import copy

import pytest
import torch

from verl.protocol import DataProto
from verl.utils.tiny_model import build_tiny_qwen2
from verl.workers.actor import DataParallelPPOActor

PROMPT, RESPONSE, BATCH = 5, 6, 8


def make_batch(seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 256, (BATCH, PROMPT + RESPONSE), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0  # a left-padded prompt
    response_mask = torch.ones(BATCH, RESPONSE, dtype=torch.long)
    response_mask[1, 3:] = 0  # a response that ended early
    attention_mask[1, PROMPT + 3 :] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "responses": input_ids[:, PROMPT:],
            "response_mask": response_mask,
            "advantages": torch.randn(BATCH, RESPONSE, generator=g),
            "old_log_probs": -torch.rand(BATCH, RESPONSE, generator=g) * 5,
            "ref_log_prob": -torch.rand(BATCH, RESPONSE, generator=g) * 5,
        },
        meta_info={"temperature": 0.7},
    )


def config(**overrides) -> dict:
    base = {
        "ppo_mini_batch_size_per_rank": BATCH,
        "ppo_micro_batch_size_per_gpu": BATCH,
        "ppo_epochs": 1,
        "clip_ratio": 0.2,
        "loss_agg_mode": "token-mean",
        "policy_loss": {"loss_mode": "vanilla"},
        "entropy_coeff": 0.01,
        "use_kl_loss": True,
        "kl_loss_coef": 0.1,
        "kl_loss_type": "low_var_kl",
        "grad_clip": 1.0,
    }
    base.update(overrides)
    return base


def make_actor(cfg: dict, seed: int = 0) -> DataParallelPPOActor:
    # SGD, not Adam: Adam turns the ~1e-10 gradient noise of a k_proj bias (softmax is shift-invariant) into
    # full-size updates, which would make parameter comparisons meaningless.
    model = build_tiny_qwen2(seed=seed)
    return DataParallelPPOActor(cfg, model, torch.optim.SGD(model.parameters(), lr=0.5))


def test_compute_log_prob_matches_a_plain_forward():
    actor = make_actor(config())
    data = make_batch()
    data.meta_info["micro_batch_size"] = 3  # uneven micro-batches: 3 + 3 + 2
    log_probs, entropy = actor.compute_log_prob(data, calculate_entropy=True)
    with torch.no_grad():
        logits = (
            actor.actor_module(
                input_ids=data.batch["input_ids"],
                attention_mask=data.batch["attention_mask"],
                position_ids=data.batch["position_ids"],
            ).logits[:, PROMPT - 1 : -1]
            / 0.7
        )
    expected = torch.log_softmax(logits, -1).gather(-1, data.batch["responses"].unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(log_probs, expected, rtol=0, atol=1e-5)
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy, -(probs * torch.log(probs)).sum(-1), rtol=0, atol=1e-5)
    assert not torch.allclose(log_probs, expected + 1e-3, rtol=0, atol=1e-5)  # the tolerance can fail


def test_micro_batching_does_not_change_the_update():
    whole, split = make_actor(config()), make_actor(config(ppo_micro_batch_size_per_gpu=3))
    metrics_whole = whole.update_policy(make_batch())
    metrics_split = split.update_policy(make_batch())
    for (name, p), q in zip(whole.actor_module.named_parameters(), split.actor_module.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac"):
        assert metrics_whole[key] == pytest.approx(metrics_split[key], rel=1e-4, abs=1e-6), key


def test_update_matches_a_hand_written_ppo_step():
    actor = make_actor(config(use_kl_loss=False, entropy_coeff=0.0, grad_clip=1e9))
    reference = copy.deepcopy(actor.actor_module)
    data = make_batch()
    metrics = actor.update_policy(data)
    # the same step written out from the PPO-clip formula (token-mean over valid tokens)
    b = data.batch
    logits = reference(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
    logp = torch.log_softmax(logits.logits[:, PROMPT - 1 : -1] / 0.7, -1)
    logp = logp.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
    ratio = torch.exp(logp - b["old_log_probs"])
    adv, mask = b["advantages"], b["response_mask"].float()
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * 3.0), per_token)  # dual clip, c = 3
    loss = (per_token * mask).sum() / mask.sum()
    loss.backward()
    opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    opt.step()
    assert metrics["actor/pg_loss"][0] == pytest.approx(loss.item(), rel=1e-5)
    for (name, p), q in zip(actor.actor_module.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_update_errors_are_clear():
    actor = make_actor(config(ppo_mini_batch_size_per_rank=3))
    with pytest.raises(ValueError, match="holds 8 samples, not a multiple of its mini-batch of 3"):
        actor.update_policy(make_batch())
    data = make_batch()
    data.pop(batch_keys=["ref_log_prob"])
    with pytest.raises(KeyError, match="ref_log_prob"):
        make_actor(config()).update_policy(data)
    with pytest.raises(RuntimeError, match="needs an optimizer"):
        DataParallelPPOActor(config(), build_tiny_qwen2()).update_policy(make_batch())


def test_non_finite_gradient_skips_the_step():
    actor = make_actor(config(use_kl_loss=False, entropy_coeff=0.0))
    before = [p.detach().clone() for p in actor.actor_module.parameters()]
    data = make_batch()
    data.batch["advantages"][0, 0] = float("nan")
    metrics = actor.update_policy(data)
    assert not torch.isfinite(torch.tensor(metrics["actor/grad_norm"][0]))
    assert all(torch.equal(a, b) for a, b in zip(before, actor.actor_module.parameters()))
