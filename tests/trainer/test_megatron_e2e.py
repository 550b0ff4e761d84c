"""The Megatron engine through ``python -m verl.trainer.main_ppo model_engine=megatron`` (Ray, 2 gloo workers, the
hf rollout engine, CPU): PPO with a Megatron actor, reference policy and critic, each split over 2 tensor-parallel
ranks (one data-parallel shard), fp32, every weight push to the rollout engine verified bit for bit.

Two runs, one after the other: 3 steps with a checkpoint after each (the actor's with its HF weights), then a run
resumed from step 2, which must log step 3 exactly as the straight run did. The model merger (``--backend
megatron``) puts the step-3 checkpoint's tensor-parallel shards back together: exactly the HF weights the engine
saved beside them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.cli_runs import Prepared, cli_run, needs
from tests.trainer.test_checkpoint_resume import assert_same_steps, steps

MEGATRON = [
    "model_engine=megatron",
    "trainer.n_gpus_per_node=2",
    "trainer.total_training_steps=3",
    "trainer.save_freq=1",
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    "critic.megatron.tensor_model_parallel_size=2",
    "critic.optim.lr=1e-4",
    "critic.ppo_micro_batch_size_per_gpu=16",
]
VERIFIED = {"VERL_VERIFY_WEIGHT_SYNC": "1"}


@cli_run("megatron_straight", cost_s=45)
def _megatron_straight(work: Path) -> Prepared:
    return Prepared(list(MEGATRON), VERIFIED)


@cli_run("megatron_resumed", cost_s=35, after=("megatron_straight",))
def _megatron_resumed(work: Path, deps: dict) -> Prepared:
    checkpoint = deps["megatron_straight"].work / "ckpt" / "global_step_2"
    return Prepared([*MEGATRON, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}"], VERIFIED)


@pytest.fixture
def straight(cli_runs):
    run = cli_runs["megatron_straight"]
    assert run.returncode == 0, run.output[-3000:]
    return run


@needs("megatron_straight")
def test_megatron_ppo_trains_its_actor_ref_and_critic(straight):
    data = [r["data"] for r in straight.records if r["data"]]
    assert len(data) == 3
    for step in data:
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "timing_s/ref"):
            assert math.isfinite(step[key]), key
        assert step["actor/grad_norm"] > 0 and step["critic/grad_norm"] > 0
        # the rollout engine's sampling log-probs against the Megatron actor's on the same tokens (both fp32)
        assert step["training/rollout_probs_diff_max"] < 1e-6
        assert step["weight_sync/tensors"] == 27  # the whole model, gathered over the tp ranks (and verified)
    assert data[0]["actor/kl_loss"] == 0  # before any update the actor is the reference policy
    assert all(step["actor/kl_loss"] > 0 for step in data[1:])
    actor = straight.work / "ckpt" / "global_step_3" / "actor"
    assert sorted(p.name for p in actor.glob("mp_rank_*.pt")) == ["mp_rank_00_000_000.pt", "mp_rank_01_000_000.pt"]


@needs("megatron_straight", "megatron_resumed")
def test_megatron_ppo_resumes_exactly(straight, cli_runs):
    code, output, records, _ = cli_runs["megatron_resumed"]
    assert code == 0, output[-3000:]
    resumed = steps(records)
    assert sorted(resumed) == [3]
    assert_same_steps(resumed, steps(straight.records))


@needs("megatron_straight")
def test_the_merger_puts_the_megatron_shards_back_together(straight, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForTokenClassification

    from verl.model_merger.__main__ import main as merger

    step = straight.work / "ckpt" / "global_step_3"
    actor = step / "actor"
    common = ["--backend", "megatron", "--local_dir", str(actor)]
    assert merger(["test", *common, "--test_hf_dir", str(actor / "huggingface")]) == 0  # exact (atol 0)
    assert merger(["merge", *common, "--target_dir", str(tmp_path / "actor")]) == 0
    merged, saved = (
        load_file(tmp_path / "actor" / "model.safetensors"),
        load_file(actor / "huggingface" / "model.safetensors"),
    )
    assert merged.keys() == saved.keys() and all((merged[k] == saved[k]).all() for k in saved)
    critic = ["--backend", "megatron", "--local_dir", str(step / "critic"), "--is_value_model"]
    assert merger(["merge", *critic, "--target_dir", str(tmp_path / "critic")]) == 0
    value_model = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic")
    assert value_model.score.weight.shape == (1, value_model.config.hidden_size)
