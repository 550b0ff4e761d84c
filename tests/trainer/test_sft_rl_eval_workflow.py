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
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.cli_runs import Prepared, cli_run, needs

VAL_PROMPTS = 32
RESPONSE_LENGTH = 8
SFT_STEPS = 20
RL_STEPS = 2


def cli_args(module: str, cwd: Path, *overrides: str) -> list[str]:
    """``python -m <module> <overrides>`` writing Hydra's folder into ``cwd``."""
    return [sys.executable, "-m", module, f"hydra.run.dir={cwd / 'hydra'}", *overrides]


def assets_and_prompts(work: Path):
    """The demo's assets (in the cache the runs share) and the RL run's validation prompts: its val_max_samples
    keep the first ones."""
    from verl.utils.demo import ensure_demo_assets

    assets = ensure_demo_assets(work.parent / "verl_cache")
    prompts = work / "val.parquet"
    pd.read_parquet(assets.val_files).head(VAL_PROMPTS).to_parquet(prompts)
    return assets, prompts


def generate(work: Path, model: str, prompts: Path) -> Prepared:
    """Greedy, one response per prompt, as the RL run validates, into ``work / "generated.parquet"``."""
    argv = cli_args(
        "verl.trainer.main_generation",
        work,
        "trainer.n_gpus_per_node=1",
        "trainer.device=cpu",
        f"data.path={prompts}",
        f"data.output_path={work / 'generated.parquet'}",
        "data.n_samples=1",
        "data.batch_size=32",
        f"model.path={model}",
        "rollout.name=hf",
        "rollout.dtype=float32",
        "rollout.do_sample=false",
        "rollout.prompt_length=32",
        f"rollout.response_length={RESPONSE_LENGTH}",
    )
    return Prepared([], {}, argv=argv)


@cli_run("workflow_sft", cost_s=60)
def _sft(work: Path) -> Prepared:
    """1. SFT on the RL task's own parquet file (the ground truth is the response)."""
    assets, _ = assets_and_prompts(work)
    argv = cli_args(
        "verl.trainer.fsdp_sft_trainer",
        work,
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
        f"trainer.default_local_dir={work / 'ckpt'}",
        "trainer.logger=[console,file]",
    )
    return Prepared([], {"VERL_FILE_LOGGER_PATH": str(work / "metrics.jsonl")}, argv=argv)


@cli_run("workflow_base_gen", cost_s=30)
def _base_gen(work: Path) -> Prepared:
    """The untrained model's generation, beside the SFT run."""
    assets, prompts = assets_and_prompts(work)
    return generate(work, assets.model_path, prompts)


@cli_run("workflow_rl", cost_s=50, after=("workflow_sft",))
def _rl(work: Path, deps: dict) -> Prepared:
    """2. RL (GRPO) from the SFT checkpoint, validating before training and at the last step, saving HF weights."""
    assets, _ = assets_and_prompts(work)
    sft_model = deps["workflow_sft"].work / "ckpt" / f"global_step_{SFT_STEPS}" / "huggingface"
    overrides = [
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
    ]
    return Prepared(overrides, {})


@cli_run("workflow_rl_gen", cost_s=30, after=("workflow_rl",))
def _rl_gen(work: Path, deps: dict) -> Prepared:
    """3. Generate with the RL model."""
    _, prompts = assets_and_prompts(work)
    rl_model = deps["workflow_rl"].work / "ckpt" / f"global_step_{RL_STEPS}" / "actor" / "huggingface"
    return generate(work, str(rl_model), prompts)


def evaluate(cli, generated: Path, work: Path) -> dict[str, float]:
    """``main_eval``'s printed result dict."""
    proc = cli.command(cli_args("verl.trainer.main_eval", work, f"data.path={generated}"), work)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    line = next(line for line in reversed(proc.stdout.splitlines()) if line.startswith("{") and "test_score/" in line)
    return ast.literal_eval(line)


@pytest.fixture
def workflow(cli_runs, cli, tmp_path) -> dict:
    runs = {name: cli_runs[f"workflow_{name}"] for name in ("sft", "base_gen", "rl", "rl_gen")}
    for name, run in runs.items():
        assert run.returncode == 0, f"{name}:\n{run.output[-4000:]}"
    base_out, rl_out = runs["base_gen"].work / "generated.parquet", runs["rl_gen"].work / "generated.parquet"
    return {
        "sft": [json.loads(line) for line in (runs["sft"].work / "metrics.jsonl").read_text().splitlines()],
        "rl": runs["rl"].records,
        "base_eval": evaluate(cli, base_out, tmp_path / "base_eval"),
        "rl_eval": evaluate(cli, rl_out, tmp_path / "rl_eval"),
        "rl_generated": pd.read_parquet(rl_out),
    }


SOURCE = "verl/arithmetic"
VAL_KEY = f"val-aux/{SOURCE}/reward/mean@1"  # the mean score (val-core holds acc)


@needs("workflow_sft", "workflow_base_gen", "workflow_rl", "workflow_rl_gen")
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
