"""veRL 0.10's hybrid switch (``trainer.v1.separate_async.hybrid_rollout.enable_switch``) off and on, with a slow
rollout pool: does lending the training workers' engines to generation shorten the steps?

    python benchmarks/bench_hybrid_switch.py [--steps 6] [--servers 1 2]

Each run is the real entry point (``python -m verl.trainer.main_ppo``, the built-in demo's tiny Qwen2, hf engine,
fp32): ``separate_async`` under ``trainer.v1.sampler.schedule=replay_buffer``, one training worker, ``--servers``
rollout servers on a pool of their own, nothing generated ahead (``num_warmup_batches=0``: the trainer waits for
each step's groups, the case the switch is for), 16 prompts × 4 samples × 64 tokens (``ignore_eos``), and a slow
pool: each server runs one request at a time (``rollout.max_num_seqs=1``). Per run, medians over the steps after
the first: the step, the trainer's wait for groups (with the switch: the wait while lent), the lending's own cost,
and the requests the lent engine served per step.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile

from bench_e2e import run_trainer  # benchmarks/, next to this script

SLOW_POOL = {
    "trainer.v1.trainer_mode": "separate_async",
    "trainer.v1.sampler.schedule": "replay_buffer",
    "trainer.v1.separate_async.num_warmup_batches": "0",
    "trainer.v1.separate_async.parameter_sync_step": "2",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "32",
    "actor_rollout_ref.hybrid_engine": "false",
    "data.max_response_length": "64",
    "actor_rollout_ref.rollout.ignore_eos": "true",
    "actor_rollout_ref.rollout.max_num_seqs": "1",
}


def median(steps: list[dict], key: str, default: float = 0.0) -> float:
    values = [s[key] for s in steps if key in s]
    return statistics.median(values) if values else default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, medians after step 1")
    print("| rollout servers | switch | step s | wait for groups s | switch cost s | lent requests / step |")
    print("|---:|---|---:|---:|---:|---:|")
    for servers in args.servers:
        for switch in (False, True):
            with tempfile.TemporaryDirectory(prefix="bench_switch-") as work:
                keys = {
                    **SLOW_POOL,
                    "actor_rollout_ref.rollout.nnodes": "1",
                    "actor_rollout_ref.rollout.n_gpus_per_node": str(servers),
                    "trainer.v1.separate_async.hybrid_rollout.enable_switch": str(switch).lower(),
                }
                steps = run_trainer(work, "hf", args.steps, keys)[0][1:]
            wait = median(steps, "timing_s/switch_wait") + median(steps, "timing_s/wait_rollout")
            cost = median(steps, "timing_s/switch_to_rollout") + median(steps, "timing_s/switch_to_trainer")
            lent = median(steps, "separate_async/switch/lent_requests")
            print(
                f"| {servers} | {'on' if switch else 'off'} | {median(steps, 'timing_s/step'):.2f} | {wait:.2f} | "
                f"{cost:.3f} | {lent:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
