"""The CPU demo of veRL's whole workflow, as docs/quickstart.md writes it: SFT the built-in tiny model on the built-in
arithmetic task (``fsdp_sft_trainer``), RL from that checkpoint (``main_ppo``, GRPO), then generate
(``main_generation``) and evaluate (``main_eval``) — every stage a real subprocess of its entry point.

The untrained model is generated and evaluated the same way, beside the SFT run. What must hold: the score after
SFT (the RL run's validation before training) is well above the untrained model's, RL does not lower it, and the
offline evaluation of the RL model agrees with the RL run's own last validation (same model, prompts and greedy
decoding).
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from tests.trainer.test_generation_eval import finish, start_cli

VAL_PROMPTS = 32
RESPONSE_LENGTH = 8
SFT_STEPS = 20
RL_STEPS = 2


def start(module: str, cwd: Path, *overrides: str, log: Path | None = None) -> subprocess.Popen:
    """``python -m <module> <overrides>`` in ``cwd`` (the file logger into ``log``)."""
    return start_cli(module, cwd, *overrides, env={"VERL_FILE_LOGGER_PATH": str(log)} if log else None)


def generate(work: Path, name: str, model: str, prompts: Path) -> tuple[subprocess.Popen, Path]:
    """Greedy, one response per prompt, as the RL run validates."""
    out = work / name / "generated.parquet"
    proc = start(
        "verl.trainer.main_generation",
        work / name,
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
        f"data.path={prompts}",
        f"data.output_path={out}",
        "data.n_samples=1",
        "data.batch_size=32",
        f"model.path={model}",
        "rollout.name=hf",
        "rollout.dtype=float32",
        "rollout.do_sample=false",
        "rollout.prompt_length=32",
        f"rollout.response_length={RESPONSE_LENGTH}",
    )
    return proc, out


def evaluate(work: Path, name: str, generated: Path) -> dict[str, float]:
    """``main_eval``'s printed result dict."""
    output = finish(start("verl.trainer.main_eval", work / name, f"data.path={generated}"))
    line = next(line for line in reversed(output.splitlines()) if line.startswith("{") and "test_score/" in line)
    return ast.literal_eval(line)


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> dict:
    from verl.utils.demo import ensure_demo_assets

    work = tmp_path_factory.mktemp("workflow")
    assets = ensure_demo_assets(work / "verl_cache")
    prompts = work / "val.parquet"  # the RL run's validation prompts: its val_max_samples keep the first ones
    pd.read_parquet(assets.val_files).head(VAL_PROMPTS).to_parquet(prompts)

    # 1. SFT on the RL task's own parquet file (the ground truth is the response), beside the untrained model's
    #    generation
    sft_dir = work / "sft"
    sft = start(
        "verl.trainer.fsdp_sft_trainer",
        sft_dir,
        f"data.train_files={assets.train_files}",
        f"data.val_files={assets.val_files}",
        "data.prompt_key=prompt",
        "data.response_key=reward_model",
        "data.response_dict_keys=[ground_truth]",
        "data.train_batch_size=32",
        "data.micro_batch_size_per_gpu=32",
        "data.max_length=32",
        f"model.partial_pretrain={assets.model_path}",
        "optim.lr=1e-3",
        "trainer.total_epochs=1",
        f"trainer.total_training_steps={SFT_STEPS}",
        f"trainer.test_freq={SFT_STEPS}",
        f"trainer.save_freq={SFT_STEPS}",
        f"trainer.default_local_dir={sft_dir / 'ckpt'}",
        "trainer.logger=[console,file]",
        log=sft_dir / "metrics.jsonl",
    )
    base_gen, base_out = generate(work, "base_gen", assets.model_path, prompts)
    finish(sft)
    finish(base_gen)
    sft_model = sft_dir / "ckpt" / f"global_step_{SFT_STEPS}" / "huggingface"

    # 2. RL (GRPO) from the SFT checkpoint, validating before training and at the last step, saving HF weights
    rl_dir = work / "rl"
    rl = start(
        "verl.trainer.main_ppo",
        rl_dir,
        f"actor_rollout_ref.model.path={sft_model}",
        f"data.train_files={assets.train_files}",
        f"data.val_files={assets.val_files}",
        f"data.val_max_samples={VAL_PROMPTS}",
        "data.shuffle=false",  # val_max_samples then keeps the first prompts, the ones generated offline
        "data.train_batch_size=16",
        "data.max_prompt_length=32",
        f"data.max_response_length={RESPONSE_LENGTH}",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.actor.optim.lr=1e-4",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_epochs=1",
        f"trainer.total_training_steps={RL_STEPS}",
        "trainer.val_before_train=true",
        f"trainer.test_freq={RL_STEPS}",
        f"trainer.save_freq={RL_STEPS}",
        f"trainer.default_local_dir={rl_dir / 'ckpt'}",
        "trainer.logger=[console,file]",
        log=rl_dir / "metrics.jsonl",
    )
    finish(rl)
    rl_model = rl_dir / "ckpt" / f"global_step_{RL_STEPS}" / "actor" / "huggingface"

    # 3. generate with the RL model, and evaluate both generations
    rl_gen, rl_out = generate(work, "rl_gen", str(rl_model), prompts)
    finish(rl_gen)
    return {
        "sft": [json.loads(line) for line in (sft_dir / "metrics.jsonl").read_text().splitlines()],
        "rl": [json.loads(line) for line in (rl_dir / "metrics.jsonl").read_text().splitlines()],
        "base_eval": evaluate(work, "base_eval", base_out),
        "rl_eval": evaluate(work, "rl_eval", rl_out),
        "rl_generated": pd.read_parquet(rl_out),
    }


SOURCE = "verl/arithmetic"
VAL_KEY = f"val-aux/{SOURCE}/reward/mean@1"  # the mean score (val-core holds acc)


def test_sft_then_rl_then_generation_and_evaluation(workflow):
    sft_losses = [r["data"]["train/loss"] for r in workflow["sft"] if "train/loss" in r["data"]]
    assert len(sft_losses) == SFT_STEPS and sft_losses[-1] < sft_losses[0] / 2, sft_losses
    by_step = {r["step"]: r["data"] for r in workflow["rl"] if r.get("data")}
    after_sft, after_rl = by_step[0][VAL_KEY], by_step[RL_STEPS][VAL_KEY]
    untrained = workflow["base_eval"][f"test_score/{SOURCE}"]
    print(f"untrained {untrained:.3f}, after SFT {after_sft:.3f}, after RL {after_rl:.3f}")
    assert after_sft > untrained + 0.2, (untrained, after_sft)  # SFT taught the answer format and some sums
    assert after_rl >= after_sft - 0.05, (after_sft, after_rl)  # RL does not undo it
    # the offline evaluation of the RL model is its last validation: the same prompts, model and greedy decoding
    offline = workflow["rl_eval"][f"test_score/{SOURCE}"]
    assert offline == pytest.approx(after_rl, abs=0.05), (offline, after_rl)
    responses = workflow["rl_generated"]["responses"]
    assert len(responses) == VAL_PROMPTS and all(len(r) == 1 and isinstance(r[0], str) for r in responses)
