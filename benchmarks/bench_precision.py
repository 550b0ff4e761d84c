"""What the cheaper arithmetic does to training: the demo's GRPO run in fp32, in bf16 mixed precision, and with the
vLLM rollout engine's dense and packed (oneDNN) CPU weights.

    python benchmarks/bench_precision.py [--steps 20] [--configs fp32 bf16 vllm_dense vllm_packed]

Each config runs ``main_ppo`` on the demo (tiny Qwen2, the arithmetic task, its defaults otherwise) for ``--steps``
steps from the same seed, and prints the median s/step and the metrics precision touches: the trainer/rollout
probability gap of the sampled tokens (``training/rollout_probs_diff_*``: the engines' numerics against the
trainer's), ``actor/ppo_kl``, the entropy and the reward over the last quarter of the steps.

- **fp32**: training and the hf rollout in float32.
- **bf16**: mixed precision (fp32 weights and AdamW, bf16 matmuls: ``fsdp_config.dtype=bfloat16``; on one rank
  under ``torch.autocast``), the hf rollout in bf16.
- **vllm_dense** / **vllm_packed**: fp32 training, the vLLM engine in bf16 (the vllm venv, ``--vllm-python``);
  dense keeps its CPU weights readable (weight-sync verification on: ``VERL_VERIFY_WEIGHT_SYNC=1``), packed lets
  vLLM pre-pack them for oneDNN (verification off).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# config → (training compute dtype, rollout engine, rollout dtype)
CONFIGS = {
    "fp32": ("float32", "hf", "float32"),
    "bf16": ("bfloat16", "hf", "bfloat16"),
    "vllm_dense": ("float32", "vllm", "bfloat16"),
    "vllm_packed": ("float32", "vllm", "bfloat16"),
}
METRICS = (
    "training/rollout_probs_diff_mean",
    "training/rollout_probs_diff_max",
    "actor/ppo_kl",
    "actor/entropy",
    "critic/score/mean",
)


def run(name: str, steps: int, python: str, work: str) -> dict:
    train_dtype, engine, rollout_dtype = CONFIGS[name]
    keys = {
        "actor_rollout_ref.actor.fsdp_config.dtype": train_dtype,
        "actor_rollout_ref.rollout.dtype": rollout_dtype,
        "actor_rollout_ref.rollout.name": engine,
        "trainer.total_training_steps": str(steps),
        "trainer.val_before_train": "false",
        "trainer.test_freq": "-1",
        "trainer.logger": "[file]",
        "hydra.run.dir": os.path.join(work, "hydra"),
        "trainer.default_local_dir": os.path.join(work, "ckpt"),
    }
    log = os.path.join(work, "metrics.jsonl")
    env = dict(os.environ, VERL_FILE_LOGGER_PATH=log, RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    env["VERL_VERIFY_WEIGHT_SYNC"] = "1" if name == "vllm_dense" else "0"
    cmd = [python, "-m", "verl.trainer.main_ppo", *(f"{k}={v}" for k, v in keys.items())]
    start = time.perf_counter()
    with open(os.path.join(work, "run.log"), "w", encoding="utf-8") as out:
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        with open(os.path.join(work, "run.log"), encoding="utf-8") as f:
            raise RuntimeError(f"{name} failed (rc {rc}):\n{f.read()[-3000:]}")
    with open(log, encoding="utf-8") as f:
        records = [r["data"] for r in map(json.loads, f) if "timing_s/step" in r.get("data", {})]
    last = records[-max(1, len(records) // 4) :]
    result = {
        "step_s": statistics.median(r["timing_s/step"] for r in records[2:]),
        "wall_s": time.perf_counter() - start,
    }
    for key in METRICS:
        values = [r[key] for r in (last if key == "critic/score/mean" else records) if key in r]
        result[key] = statistics.mean(values) if values else float("nan")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--vllm-python", default=os.path.join(REPO, ".venv-vllm", "bin", "python"))
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_precision-") as tmp:
        for name in args.configs:
            python = args.vllm_python if CONFIGS[name][1] == "vllm" else sys.executable
            if not os.path.exists(python):
                print(f"{name} skipped: no {python}", flush=True)
                continue
            work = tempfile.mkdtemp(dir=tmp, prefix=f"{name}-")
            results[name] = run(name, args.steps, python, work)
            print(f"{name}: {results[name]['step_s']:.3f} s/step", flush=True)
    print(f"\ndemo, {args.steps} steps; means over the steps (score: the last quarter)\n")
    print("| config | s/step | " + " | ".join(METRICS) + " |")
    print("|---|---:|" + "---:|" * len(METRICS))
    for name, r in results.items():
        print(f"| {name} | {r['step_s']:.3f} | " + " | ".join(f"{r[k]:.4g}" for k in METRICS) + " |")


if __name__ == "__main__":
    main()
