"""DataParallelPPOActor in one process on a real tiny Qwen2 (the 2-rank FSDP2 case is in the worker tests)."""

from __future__ import annotations

import copy

import pytest
import torch

from verl.protocol import DataProto
from verl.utils import padding
from verl.utils.seqlen_balancing import rearrange_micro_batches
from verl.utils.tiny_model import build_tiny_qwen2
from verl.workers.actor import DataParallelPPOActor
from verl.workers.actor.dp_actor import split_micro_batches

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
        "ppo_mini_batch_size": BATCH,
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
    # Σπ² of the tempered distribution (the optimal-token baselines' input), in the same pass
    outputs = actor.compute_log_prob_outputs(data, calculate_sum_pi_squared=True)
    assert set(outputs) == {"log_probs", "sum_pi_squared"}
    torch.testing.assert_close(outputs["sum_pi_squared"], probs.square().sum(-1), rtol=0, atol=1e-6)


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


def _hand_log_probs_and_entropy(model: torch.nn.Module, b) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each response token and the entropy of its tempered (T = 0.7) next-token distribution."""
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]).logits
    log_dist = torch.log_softmax(logits[:, PROMPT - 1 : -1] / 0.7, -1)
    entropy = -(log_dist.exp() * log_dist).sum(-1)
    return log_dist.gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1), entropy


def _hand_agg(x: torch.Tensor, mask: torch.Tensor, loss_agg_mode: str) -> torch.Tensor:
    if loss_agg_mode == "token-mean":  # over every valid token of the mini-batch
        return (x * mask).sum() / mask.sum()
    assert loss_agg_mode == "seq-mean-token-mean"  # each sequence's token mean, then the mean over sequences
    return ((x * mask).sum(-1) / mask.sum(-1)).mean()


@pytest.mark.parametrize(
    "kl_loss_type, loss_agg_mode", [("low_var_kl", "token-mean"), ("k1", "seq-mean-token-mean")], ids=["k3", "k1"]
)
def test_kl_loss_and_entropy_terms_match_a_hand_written_step(kl_loss_type, loss_agg_mode):
    lr, kl_coef, ent_coef = 0.5, 0.3, 0.01
    cfg = config(
        kl_loss_type=kl_loss_type,
        kl_loss_coef=kl_coef,
        entropy_coeff=ent_coef,
        loss_agg_mode=loss_agg_mode,
        ppo_micro_batch_size_per_gpu=3,  # 3 + 3 + 2 rows: the terms are aggregated over the whole mini-batch
        grad_clip=1e9,
    )
    actor = make_actor(cfg)
    reference = copy.deepcopy(actor.actor_module)
    before = [p.detach().clone() for p in reference.parameters()]
    data = make_batch()
    b = data.batch
    mask = b["response_mask"].float()
    # Reference log-probs within ±1 nat of the policy's own (make_batch's are so far off that low_var_kl would sit
    # at its clamp), plus two tokens beyond low_var_kl's clamp at 10: k3(-15) = e^-15 + 14 and k3(3) = e^3 - 4.
    with torch.no_grad():
        logp0, _ = _hand_log_probs_and_entropy(reference, b)
    offset = torch.rand(logp0.shape, generator=torch.Generator().manual_seed(1)) * 2 - 1
    offset[2, 1], offset[3, 4] = -15.0, 3.0
    b["ref_log_prob"] = logp0 + offset
    metrics = actor.update_policy(data)

    # The step written out: PPO-clip (dual clip, c = 3) − entropy_coeff · entropy + kl_loss_coef · KL(π ‖ π_ref).
    logp, entropy = _hand_log_probs_and_entropy(reference, b)
    ratio = torch.exp(logp - b["old_log_probs"])
    adv = b["advantages"]
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    pg = torch.where(adv < 0, torch.minimum(pg, -adv * 3.0), pg)
    delta = logp - b["ref_log_prob"]  # log π − log π_ref
    if kl_loss_type == "k1":
        kl = delta
    else:  # k3 = e^{−Δ} + Δ − 1 (Schulman's low-variance estimator), −Δ clamped to ±20, the value to [−10, 10]
        log_ratio = (-delta).clamp(-20.0, 20.0)
        kl = (torch.exp(log_ratio) - log_ratio - 1).clamp(-10.0, 10.0)
        assert int((kl.detach() == 10.0).sum()) == 2  # the two planted tokens, and only those, hit the clamp
    pg_loss, ent_loss, kl_loss = (_hand_agg(x, mask, loss_agg_mode) for x in (pg, entropy, kl))
    params = list(reference.parameters())
    grads = {
        name: torch.autograd.grad(term, params, retain_graph=True, allow_unused=True)
        for name, term in (("pg", pg_loss), ("entropy", ent_loss), ("kl", kl_loss))
    }

    def update(pg_sign: float, ent_sign: float, kl_sign: float) -> torch.Tensor:
        """−lr · ∇(pg_sign·pg_loss + ent_sign·entropy_coeff·entropy + kl_sign·kl_loss_coef·kl), flattened."""
        parts = []
        for i, p in enumerate(params):
            total = torch.zeros_like(p)
            for name, weight in (("pg", pg_sign), ("entropy", ent_sign * ent_coef), ("kl", kl_sign * kl_coef)):
                if grads[name][i] is not None:
                    total = total + weight * grads[name][i]
            parts.append(-lr * total.reshape(-1))
        return torch.cat(parts)

    assert metrics["actor/pg_loss"][0] == pytest.approx(pg_loss.item(), rel=1e-5)
    assert metrics["actor/entropy"][0] == pytest.approx(ent_loss.item(), rel=1e-5)
    assert metrics["actor/kl_loss"][0] == pytest.approx(kl_loss.item(), rel=1e-5)
    assert metrics["actor/kl_coef"] == [kl_coef]
    expected = update(1.0, -1.0, 1.0)  # veRL's signs: entropy is a bonus (subtracted), the KL a penalty (added)
    actual = torch.cat([(p.detach() - q).reshape(-1) for p, q in zip(actor.actor_module.parameters(), before)])
    # float32: the update is a difference of O(1) weights, so it is exact to ~1e-7 absolute. Measured ≤ 6e-8.
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6)
    for wrong in (update(1.0, 1.0, 1.0), update(1.0, -1.0, -1.0), update(1.0, 0.0, 1.0), update(1.0, -1.0, 0.0)):
        assert not torch.allclose(actual, wrong, rtol=0, atol=1e-6)  # a flipped or dropped term is caught
    # the norm of one long float32 vector: summed in float64, else its rounding (~1e-5) would swamp the check
    assert metrics["actor/grad_norm"][0] == pytest.approx(expected.double().norm().item() / lr, rel=1e-6)


def test_a_last_partial_mini_batch_is_trained_as_veRL_does():
    """8 samples meet a mini-batch of 3: three steps, on 3 + 3 + 2 samples, the same as three updates on those
    slices."""
    whole = make_actor(config(ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=3, shuffle=False))
    metrics = whole.update_policy(make_batch())
    assert len(metrics["actor/pg_loss"]) == 3
    sliced = make_actor(config(ppo_mini_batch_size=3, ppo_micro_batch_size_per_gpu=3, shuffle=False))
    for rows in ([0, 1, 2], [3, 4, 5], [6, 7]):
        sliced.update_policy(make_batch().select_idxs(rows))
    for p, q in zip(whole.actor_module.parameters(), sliced.actor_module.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def test_update_errors_are_clear():
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


# ---------------------------------------------------------------------------------------------------------------
# use_remove_padding and use_dynamic_bsz give the padded, fixed-micro-batch results
# ---------------------------------------------------------------------------------------------------------------
# float32; the paths differ only in summation order (other matmul shapes, another micro-batch grouping). Measured:
# log-probs ≤ 1e-6, entropy ≤ 5e-7, parameters after a step ≤ 3e-8. The tolerance is 1e-5, absolute.
TOL = 1e-5
PROMPT_LENS = [5, 2, 4, 1, 3, 5, 2, 4]
RESPONSE_LENS = [6, 1, 3, 6, 2, 5, 4, 0]


def make_ragged_batch(seed: int = 0) -> DataProto:
    """Left-padded prompts and right-padded responses of assorted lengths (one response is empty)."""
    data = make_batch(seed)
    b = data.batch
    b["attention_mask"].zero_()
    b["response_mask"].zero_()
    for row, (p, r) in enumerate(zip(PROMPT_LENS, RESPONSE_LENS)):
        b["attention_mask"][row, PROMPT - p : PROMPT + r] = 1
        b["response_mask"][row, :r] = 1
    b["input_ids"].masked_fill_(b["attention_mask"] == 0, 0)
    b["responses"] = b["input_ids"][:, PROMPT:]
    b["position_ids"] = (b["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return data


def assert_equal_within_tol(actual: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor) -> None:
    actual, expected = actual * mask, expected * mask
    torch.testing.assert_close(actual, expected, rtol=0, atol=TOL)
    assert not torch.allclose(actual + 1e-4 * mask, expected, rtol=0, atol=TOL)  # the tolerance can fail


def assert_same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    moved = False
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=TOL, msg=name)
    for p, q in zip(a.parameters(), build_tiny_qwen2(seed=0).parameters()):
        moved |= bool((p - q).abs().max() > 1e-3)
    assert moved  # the step changed the model (else equal parameters would prove nothing)


@pytest.fixture(params=["trim", "pack"])
def layout(request, monkeypatch):
    """use_remove_padding trims on sdpa (this model's backend); "pack" forces the packed row that flash-attention
    backends take (no flash attention on CPU: the packed row runs on sdpa under its block mask)."""
    if request.param == "pack":
        monkeypatch.setattr(padding, "packs_sequences", lambda module: True)
    return request.param


@pytest.mark.parametrize("dynamic", [False, True])
def test_remove_padding_and_dynamic_bsz_log_probs_equal_the_padded_path(dynamic, layout):
    padded, packed = make_actor(config()), make_actor(config(use_remove_padding=True))
    data = make_ragged_batch()
    data.meta_info["micro_batch_size"] = 3
    expected_lp, expected_ent = padded.compute_log_prob(data, calculate_entropy=True)
    if dynamic:
        data.meta_info.update(use_dynamic_bsz=True, max_token_len=12)  # 38 tokens → 4 micro-batches, reordered
    log_probs, entropy = packed.compute_log_prob(data, calculate_entropy=True)
    # compare wherever the predicting token is real: the response plus the first position after it
    reading = data.batch["attention_mask"][:, PROMPT - 1 : -1]
    assert_equal_within_tol(log_probs, expected_lp, reading)
    assert_equal_within_tol(entropy, expected_ent, reading)
    expected_spi = padded.compute_log_prob_outputs(data, calculate_sum_pi_squared=True)["sum_pi_squared"]
    spi = packed.compute_log_prob_outputs(data, calculate_sum_pi_squared=True)["sum_pi_squared"]
    assert_equal_within_tol(spi, expected_spi, reading)
    assert bool((log_probs[reading == 0] == 0).all())  # padding reads nothing in the packed path


def test_dynamic_bsz_restores_row_order_in_the_padded_path():
    actor = make_actor(config())
    data = make_ragged_batch()
    data.meta_info["micro_batch_size"] = 3
    expected, _ = actor.compute_log_prob(data)
    data.meta_info.update(use_dynamic_bsz=True, max_token_len=12)
    _, groups = rearrange_micro_batches(data, max_token_len=12)
    assert [i for g in groups for i in g] != list(range(len(data)))  # rows really were regrouped
    log_probs, _ = actor.compute_log_prob(data)
    assert_equal_within_tol(log_probs, expected, data.batch["response_mask"])


@pytest.mark.parametrize(
    "overrides",
    [
        {"use_remove_padding": True},
        {"use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 12},
        {"use_remove_padding": True, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 12},
    ],
    ids=["remove_padding", "dynamic_bsz", "both"],
)
def test_update_equals_the_padded_fixed_micro_batch_update(overrides, layout):
    reference = make_actor(config(ppo_micro_batch_size_per_gpu=3))
    actor = make_actor(config(ppo_micro_batch_size_per_gpu=3, **overrides))
    expected = reference.update_policy(make_ragged_batch())
    metrics = actor.update_policy(make_ragged_batch())
    assert_same_parameters(actor.actor_module, reference.actor_module)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac"):
        assert metrics[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-7), key


def test_dynamic_bsz_and_micro_batch_errors():
    data = make_ragged_batch()
    data.meta_info["use_dynamic_bsz"] = True
    with pytest.raises(ValueError, match="use_dynamic_bsz needs a token budget"):
        make_actor(config()).compute_log_prob(data)
    with pytest.raises(ValueError, match="a sequence of 11 tokens exceeds max_token_len=8"):
        make_actor(config(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=8)).update_policy(make_ragged_batch())
    with pytest.raises(ValueError, match="micro-batch size must be a positive integer, got 0"):
        split_micro_batches(make_ragged_batch(), 0)


# ---------------------------------------------------------------------------------------------------------------
# the on-policy update takes its old log-probs from its own forward (verl.trainer.ppo.on_policy): bit for bit
@pytest.mark.parametrize("remove_padding", [False, True])
@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_on_policy_update_equals_a_separate_old_log_prob_pass_bit_for_bit(remove_padding, entropy_coeff):
    cfg = config(ppo_micro_batch_size_per_gpu=3, use_remove_padding=remove_padding, entropy_coeff=entropy_coeff)
    reference, actor = make_actor(cfg), make_actor(cfg)
    data = make_ragged_batch()
    data.meta_info["micro_batch_size"] = 3  # the log-prob pass cut as the update is
    old, entropys = reference.compute_log_prob(data, calculate_entropy=True)
    data.batch["old_log_probs"] = old
    expected = reference.update_policy(data)
    on_policy = make_ragged_batch()
    on_policy.pop(batch_keys=["old_log_probs"])
    on_policy.meta_info["old_log_prob_in_update"] = True
    metrics = actor.update_policy(on_policy)
    assert metrics == expected  # every metric, exactly (the ratio is 1 in both)
    assert torch.equal(actor.on_policy_outputs["old_log_probs"], old)
    assert torch.equal(actor.on_policy_outputs["entropys"], entropys)
    for p, q in zip(actor.actor_module.parameters(), reference.actor_module.parameters(), strict=True):
        assert torch.equal(p, q)
    reference.update_policy(data)
    assert reference.on_policy_outputs is None  # only an on-policy update records them


def test_on_policy_update_needs_one_epoch_and_one_mini_batch():
    data = make_ragged_batch()
    data.meta_info["old_log_prob_in_update"] = True
    with pytest.raises(ValueError, match="one PPO epoch and one mini-batch"):
        make_actor(config(ppo_mini_batch_size=4, ppo_micro_batch_size_per_gpu=4)).update_policy(data)
    with pytest.raises(ValueError, match="one PPO epoch and one mini-batch"):
        make_actor(config(ppo_epochs=2)).update_policy(data)
