"""TRL's ``GRPOTrainer`` on one workload, timed per step: the peer side of ``bench_vs_trl.py``.

Runs in TRL's own venv (``bash benchmarks/setup_trl_venv.sh``), never ours:

    .venv-trl/bin/python benchmarks/trl_grpo.py SPEC.json OUT.json

SPEC holds the model folder, a jsonl of ``{"prompt": [chat messages], "ground_truth": "7"}`` rows, the sizes and the
dtype, and the path of the reward file (``verl/utils/reward_score/arithmetic.py``, loaded by path: it needs nothing
but the standard library). OUT gets each step's end time and TRL's logged metrics.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time

import torch
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer


def load_reward(path: str):
    spec = importlib.util.spec_from_file_location("bench_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def reward(completions, ground_truth, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(module.compute_score(t, g)["score"]) for t, g in zip(texts, ground_truth, strict=True)]

    reward.__name__ = "arithmetic"
    return reward


class StepClock(TrainerCallback):
    """Each optimizer step's end time and each logged record."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.logs: list[dict] = []

    def on_step_end(self, args, state, control, **kwargs):
        self.ends.append(time.perf_counter())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs:
            self.logs.append({k: v for k, v in logs.items() if isinstance(v, (int, float))})


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        spec = json.load(f)
    torch.set_num_threads(spec["threads"])
    with open(spec["data"], encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    batch = spec["prompts"] * spec["generations"]
    bf16 = spec["dtype"] == "bf16"
    config = GRPOConfig(
        output_dir=spec["output_dir"],
        use_cpu=True,
        bf16=bf16,  # mixed precision: fp32 weights and optimizer, bf16 autocast
        fp16=False,
        model_init_kwargs={"dtype": torch.float32},
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        steps_per_generation=1,  # one optimizer step per generation batch
        num_generations=spec["generations"],
        max_completion_length=spec["response_length"],
        temperature=1.0,
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        beta=0.0,
        num_iterations=1,
        max_steps=spec["steps"],
        seed=spec["seed"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        dataloader_num_workers=0,
        disable_tqdm=True,
        gradient_checkpointing=True,  # TRL's default, and ours (actor_rollout_ref.model.enable_gradient_checkpointing)
    )
    clock = StepClock()
    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=load_reward(spec["reward_file"]),
        args=config,
        train_dataset=Dataset.from_list(rows),
        callbacks=[clock],
    )
    start = time.perf_counter()
    trainer.train()
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump({"start": start, "ends": clock.ends, "logs": clock.logs}, f)


if __name__ == "__main__":
    main()
