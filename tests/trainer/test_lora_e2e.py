"""LoRA through ``python -m verl.trainer.main_ppo`` (Ray, the hf engine, CPU): PPO with a LoRA actor (its reference
policy is the base model with the adapters disabled) and a LoRA critic, every weight push verified bit for bit.

Two runs, one after the other: 4 steps with a checkpoint at steps 2 and 4, then a run resumed from step 2, which must
log steps 3 and 4 exactly as the straight run did. The model merger turns the step-4 checkpoint into a Hugging Face
folder whose logits are the trained policy's.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.cli_runs import Prepared, cli_run, needs
from tests.trainer.test_checkpoint_resume import assert_same_steps, steps

LORA = [
    "trainer.total_training_steps=4",
    "trainer.save_freq=2",
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.model.lora_rank=8",
    "actor_rollout_ref.model.lora_alpha=16",
    "actor_rollout_ref.model.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
    "critic.model.lora_rank=4",
    "critic.ppo_micro_batch_size_per_gpu=16",
    "critic.model.fsdp_config.dtype=float32",
    "critic.optim.lr=1e-3",
]
VERIFIED = {"VERL_VERIFY_WEIGHT_SYNC": "1"}


@cli_run("lora_straight", cost_s=80)
def _lora_straight(work: Path) -> Prepared:
    return Prepared(list(LORA), VERIFIED)


@cli_run("lora_resumed", cost_s=60, after=("lora_straight",))
def _lora_resumed(work: Path, deps: dict) -> Prepared:
    checkpoint = deps["lora_straight"].work / "ckpt" / "global_step_2"
    return Prepared([*LORA, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={checkpoint}"], VERIFIED)


@pytest.fixture
def lora_runs(cli_runs) -> dict:
    """The straight run (checked to have succeeded) and, when the test named it, the resumed one."""
    straight = cli_runs["lora_straight"]
    assert straight.returncode == 0, straight.output[-3000:]
    return {"straight": straight, "resumed": cli_runs["lora_resumed"] if "lora_resumed" in cli_runs else None}


@needs("lora_straight")
def test_lora_ppo_pushes_adapters_only_and_its_reference_is_the_base_model(lora_runs):
    from safetensors.torch import load_file

    _, _, records, work = lora_runs["straight"]
    data = [r["data"] for r in records if r["data"]]
    assert len(data) == 4
    adapters = load_file(Path(work) / "ckpt" / "global_step_4" / "actor" / "lora_adapter" / "adapter_model.safetensors")
    assert len(adapters) == 28  # A and B of q k v o gate up down in 2 layers
    numel = sum(t.numel() for t in adapters.values())
    for step in data:  # every push after version 0 carries the adapters alone, verified in the engine
        assert step["weight_sync/adapters_only"] == 1 and step["weight_sync/tensors"] == 28
        assert step["weight_sync/bytes"] == numel * 4  # the rollout's float32
        # the engine's sampling log-probs against the actor's on the same tokens (both fp32, same adapters)
        assert step["training/rollout_probs_diff_max"] < 1e-6
        assert step["critic/vf_loss"] > 0 and step["critic/grad_norm"] > 0
    assert all("timing_s/ref" in step for step in data)  # the reference policy ran (in the actor's engine)
    assert data[0]["actor/kl_loss"] == 0  # before any update the actor is its base model
    assert all(step["actor/kl_loss"] > 0 for step in data[1:])  # then the adapters move it away from the ref


@needs("lora_straight", "lora_resumed")
def test_lora_ppo_resumes_exactly(lora_runs):
    _, _, straight, _ = lora_runs["straight"]
    code, output, records, _ = lora_runs["resumed"]
    assert code == 0, output[-3000:]
    resumed = steps(records)
    assert sorted(resumed) == [3, 4]
    assert_same_steps(resumed, steps(straight))


@needs("lora_straight")
def test_merged_checkpoint_gives_the_trained_policy(lora_runs, tmp_path):
    """The merger's folder and the checkpoint's own huggingface folder (both merged) against the base model plus the
    saved adapter, on the same tokens."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from verl.model_merger.__main__ import main as merger
    from verl.workers.engine.lora import read_adapter_config

    _, _, _, work = lora_runs["straight"]
    actor = Path(work) / "ckpt" / "global_step_4" / "actor"
    target = tmp_path / "merged"
    assert merger(["merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir", str(target)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    saved = AutoModelForCausalLM.from_pretrained(actor / "huggingface", dtype=torch.float32)
    base_path = read_adapter_config(str(actor / "lora_adapter"))["base_model_name_or_path"]  # the demo's model
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    trained = PeftModel.from_pretrained(base, actor / "lora_adapter")
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = trained(ids).logits
        torch.testing.assert_close(merged(ids).logits, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(saved(ids).logits, merged(ids).logits, rtol=0, atol=0)


@pytest.mark.vllm
def test_lora_on_the_vllm_engine(tmp_path, cli):
    """vLLM (the CPU build) serves the adapters through its LoRA interface, a folder per version; the base comes from
    the first push only (the engine starts from random weights), every push is verified, and the engine's sampling
    log-probs agree with the actor's."""
    pytest.importorskip("vllm", reason="runs in the vllm venv")
    code, output, records = cli(
        tmp_path,
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.load_format=dummy",
        "trainer.total_training_steps=3",
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        env=VERIFIED,
    )
    assert code == 0, output[-3000:]
    data = [r["data"] for r in records if r["data"]]
    assert len(data) == 3
    for step in data:
        assert step["weight_sync/adapters_only"] == 1 and step["weight_sync/tensors"] == 28
        assert step["training/rollout_probs_diff_max"] < 1e-3  # trainer and engine agree with the adapters on
    assert data[-1]["actor/grad_norm"] > 0
