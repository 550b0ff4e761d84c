"""DAPO's dynamic sampling under the two schedules (``trainer.v1.sampler.schedule``): ``fixed_lag`` (ours: whole
generation batches of ``data.gen_batch_size`` prompts until the training batch is full) against ``replay_buffer``
(veRL 0.10's; sync: the training batch dispatched, then refills of 2 prompts per evicted group, at most
``max_inflight_gen_batches`` × ``train_batch_size`` at a time, the surplus discarded; colocate_async: one batch ahead,
refills one for one, the surplus kept for later steps).

    python benchmarks/bench_dapo_schedules.py [--steps 8]

Each run is the real entry point (``python -m verl.trainer.main_ppo``, the built-in demo: tiny Qwen2, 16 prompts ×
4 samples, hf engine, one CPU worker; colocate_async adds a resident rollout server on the same bundle) with
``algorithm.filter_groups`` on ``seq_reward``. Per step (medians after the first): prompts used up, generation
batches (fixed lag), groups evicted, surplus discarded, the ``gen`` stage and the step.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile

from bench_e2e import run_trainer  # benchmarks/, next to this script

TRAIN_BATCH = 16
BUFFER = {"trainer.v1.sampler.schedule": "replay_buffer"}
COLOCATE = {"trainer.v1.trainer_mode": "colocate_async", "trainer.n_gpus_per_node": "1"}
RUNS = {
    "sync, fixed_lag, gen_batch_size 16": {"data.gen_batch_size": "16"},
    "sync, fixed_lag, gen_batch_size 32": {"data.gen_batch_size": "32"},
    "sync, replay_buffer, in flight 1": {**BUFFER, "algorithm.filter_groups.max_inflight_gen_batches": "1"},
    "sync, replay_buffer, in flight 2": {**BUFFER, "algorithm.filter_groups.max_inflight_gen_batches": "2"},
    "colocate_async lag 1, fixed_lag": {**COLOCATE, "data.gen_batch_size": "16"},
    "colocate_async warm-up 1, replay_buffer": {**COLOCATE, **BUFFER},
}
DAPO = {"algorithm.filter_groups.enable": "true", "algorithm.filter_groups.metric": "seq_reward"}


def prompts_generated(step: dict, gen_batch_size: int | None) -> int:
    """Prompts the step used up: whole batches under ``fixed_lag``; trained + evicted + discarded under the buffer
    (colocate_async's keeps its surplus for later steps, so there it counts what the step consumed)."""
    if gen_batch_size is not None:
        return int(step["train/num_gen_batches"]) * gen_batch_size
    evicted = step["training/filter_groups/evicted_samples"]
    return int(TRAIN_BATCH + evicted + step["training/filter_groups/discarded_surplus_samples"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {args.steps} steps, medians after step 1")
    print("| schedule | prompts generated / step | generation batches | evicted | discarded | gen s | step s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, overrides in RUNS.items():
        with tempfile.TemporaryDirectory(prefix="bench_dapo-") as work:
            steps, _ = run_trainer(work, "hf", args.steps, {**DAPO, **overrides})
        gen_batch = int(overrides["data.gen_batch_size"]) if "data.gen_batch_size" in overrides else None
        timed = steps[1:]

        def median(values: list[float]) -> float:
            return statistics.median(values)

        row = (
            median([prompts_generated(s, gen_batch) for s in timed]),
            median([s.get("train/num_gen_batches", 0) for s in timed]),
            median([s["training/filter_groups/evicted_samples"] for s in timed]),
            median([s["training/filter_groups/discarded_surplus_samples"] for s in timed]),
            median([s["timing_s/gen"] for s in timed]),
            median([s["timing_s/step"] for s in timed]),
        )
        print(f"| {label} | {row[0]:.0f} | {row[1]:.0f} | {row[2]:.0f} | {row[3]:.0f} | {row[4]:.3f} | {row[5]:.3f} |")


if __name__ == "__main__":
    main()
