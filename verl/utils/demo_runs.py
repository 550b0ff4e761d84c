"""Running the trainers' command lines from an example script: one stage per subprocess, its metrics read back.

The examples that chain runs (SFT, then RL from its checkpoint) call :func:`run_module` for each stage; a stage that
fails stops the script with the end of its log. :func:`read_metrics` reads the file logger's JSON lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["demo_grpo_overrides", "read_metrics", "run_module"]


def run_module(module: str, cwd: Path, log: Path, *overrides: str) -> None:
    """``python -m <module> <overrides>`` in ``cwd`` (its output in ``cwd/output.log``), its file logger writing to
    ``log``; raises ``SystemExit`` with the end of the output if it fails."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(log), "HYDRA_FULL_ERROR": "1"}
    with open(cwd / "output.log", "w") as out:
        proc = subprocess.run([sys.executable, "-m", module, *overrides], cwd=cwd, env=env, stdout=out, stderr=out)
    if proc.returncode != 0:
        tail = (cwd / "output.log").read_text()[-4000:]
        raise SystemExit(f"{module} failed ({proc.returncode}); the end of {cwd / 'output.log'}:\n{tail}")


def demo_grpo_overrides(
    assets: Any, workdir: Path, *, steps: int, lr: float, val_prompts: int, save_freq: int = -1
) -> list[str]:
    """``main_ppo`` overrides of a GRPO run of the demo's model on its arithmetic task, sized for a CPU: 16 prompts ×
    4 samples a step, 8 response tokens, the hf engine, one worker, ``steps`` steps at ``lr``, validation on
    ``val_prompts`` held-out questions before training and four times during it, checkpoints under
    ``workdir/ckpt`` every ``save_freq`` steps (-1: none; each with the actor's HF weights in
    ``global_step_<n>/actor/huggingface``). Examples add what makes them theirs (a reward, a teacher)."""
    return [
        f"actor_rollout_ref.model.path={assets.model_path}",
        f"data.train_files={assets.train_files}",
        f"data.val_files={assets.val_files}",
        f"data.val_max_samples={val_prompts}",
        "data.train_batch_size=16",
        "data.max_prompt_length=32",
        "data.max_response_length=8",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=true",
        f"trainer.test_freq={max(1, steps // 4)}",
        f"trainer.save_freq={save_freq}",
        *(["actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]"] if save_freq > 0 else []),
        f"trainer.default_local_dir={workdir / 'ckpt'}",
        "trainer.logger=[console,file]",
    ]


def read_metrics(log: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(step, metrics)`` for each record of a file logger's JSON lines."""
    records = []
    for line in Path(log).read_text().splitlines():
        record = json.loads(line)
        records.append((record["step"], record.get("data") or {}))
    return records
