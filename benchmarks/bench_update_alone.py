"""The actor update inside a run against the same update alone, on ``bench_vs_trl``'s workloads.

    python benchmarks/bench_update_alone.py [--workloads smollm2] [--dtypes fp32] [--updates 4] [--steps N]

- **in a run**: ``main_ppo`` on the workload (``bench_vs_trl.py``'s settings, its memory sampler on); the figure is
  the worker's own ``perf/update_actor_seconds`` of the steps after the warm-up.
- **alone**: the same worker class (``ActorRolloutRefWorker``, hybrid: its hf rollout engine loaded beside the
  actor as in the run) built from the same composed config, in one Ray worker with the thread count ``main_ppo``
  gives it, and nothing else running; it updates ``--updates`` times on a batch of the run's shape (the workload's
  prompts through the chat template, left-padded; full-length responses; advantages of ±1, so nothing is skipped),
  the first update a warm-up.

Printed: the median seconds of each, in-run / alone, and the alone call's own cost (the driver's wall time of
``update_actor`` above the worker's). The two are comparable where the run skips no sample
(SmolLM2 with the shaped reward: 0% skipped); the tiny model's run skips ~70% of its samples' gradient pass, the
alone batch none, so ``tiny`` only shows the call's cost.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vs_trl  # noqa: E402  (benchmarks/, next to this script)


def update_batch(model: str, rows: list[dict], spec: dict):
    """A batch of the run's shape: the first ``prompts`` rows' prompts (chat template, left-padded) × ``generations``
    samples of ``response_length`` random tokens, with advantages of ±1 within each group."""
    from transformers import AutoTokenizer

    from verl.protocol import DataProto

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [
        tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
        for row in rows[: spec["prompts"]]
    ]
    prompts = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    width, length, n = max(map(len, prompts)), spec["response_length"], spec["generations"]
    generator = torch.Generator().manual_seed(0)
    samples = len(prompts) * n
    ids = torch.zeros(samples, width + length, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, prompt in enumerate(p for p in prompts for _ in range(n)):
        ids[i, width - len(prompt) : width] = torch.tensor(prompt)
        mask[i, width - len(prompt) :] = 1
    responses = torch.randint(3, len(tokenizer), (samples, length), generator=generator)
    ids[:, width:] = responses
    advantages = torch.tensor([1.0, -1.0] * (samples // 2))[:, None].expand(samples, length).contiguous()
    return DataProto.from_dict(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": responses,
            "response_mask": torch.ones(samples, length),
            "advantages": advantages,
        },
        {"uid": np.repeat(np.arange(len(prompts)), n).astype(str).astype(object)},
        meta_info={"temperature": 1.0, "old_log_prob_in_update": True, "global_steps": 1},
    )


def run_alone(
    spec: dict, model: str, train_file: str, dtype: str, rows: list[dict], updates: int
) -> tuple[list[float], list[float]]:
    """``perf/update_actor_seconds`` of ``updates`` updates of the worker alone, and the driver's wall seconds of
    each call (the worker's time plus the call's own cost)."""
    import ray

    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.trainer.config.compose import compose_config
    from verl.utils.ray_utils import cpu_threads_per_worker
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    overrides = bench_vs_trl.ours_overrides(spec, model, train_file, dtype)
    config = compose_config(overrides=[f"{k}={v}" for k, v in overrides.items()])
    env = {"OMP_NUM_THREADS": str(cpu_threads_per_worker(1)), "TOKENIZERS_PARALLELISM": "false"}
    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {**env, "RAY_AUTH_MODE": "disabled"}})
    try:
        cls = RayClassWithInitArgs(
            ray.remote(ActorRolloutRefWorker), config=config.actor_rollout_ref, role="actor_rollout"
        )
        wg = RayWorkerGroup(RayResourcePool([1], use_gpu=False), cls)
        wg.init_model()
        batch = update_batch(model, rows, spec)
        seconds, calls = [], []
        for _ in range(updates):
            start = time.perf_counter()
            out = wg.update_actor(batch)
            calls.append(time.perf_counter() - start)
            value = out.meta_info["metrics"]["perf/update_actor_seconds"]
            seconds.append(value[0] if isinstance(value, list) else value)  # one rank
        return seconds, calls
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["smollm2"], choices=list(bench_vs_trl.WORKLOADS))
    parser.add_argument("--dtypes", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    parser.add_argument("--updates", type=int, default=4, help="updates of the worker alone (the first a warm-up)")
    parser.add_argument("--steps", type=int, default=None, help="steps of the run (default: the workload's)")
    args = parser.parse_args()
    rows_out = []
    with tempfile.TemporaryDirectory(prefix="bench_update_alone-") as tmp:
        for name in args.workloads:
            prepared = bench_vs_trl.prepare_workload(name, tmp, args.steps)
            if prepared is None:
                continue
            spec, model, train_file, rows = prepared
            for dtype in args.dtypes:
                seconds, calls = run_alone(spec, model, train_file, dtype, rows, args.updates)
                alone = seconds[1:]  # after a warm-up
                # the call's own cost: the driver's wall time of update_actor above the worker's time
                call_ms = 1000 * statistics.median(c - s for c, s in zip(calls[1:], alone))
                work = tempfile.mkdtemp(dir=tmp, prefix=f"{name}-{dtype}-")
                run = bench_vs_trl.run_ours(work, spec, model, train_file, dtype)
                in_run = [s["perf/update_actor_seconds"] for s in run["steps"]]
                rows_out.append(
                    (name, dtype, statistics.median(in_run), statistics.median(alone), call_ms, run["sampler_cpu"])
                )
                print(f"{name} {dtype}: in a run {in_run}, alone {alone}", flush=True)
    print(
        "\n| workload | dtype | update in a run (s) | update alone (s) | in a run / alone | the alone call's own cost |"
        " memory sampler CPU |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, dtype, in_run, alone, call_ms, sampler in rows_out:
        print(
            f"| {name} | {dtype} | {in_run:.3f} | {alone:.3f} | {in_run / alone:.2f} | {call_ms:.1f} ms | "
            f"{sampler:.1%} |"
        )


if __name__ == "__main__":
    main()
