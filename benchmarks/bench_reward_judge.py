"""A served judge (generative reward model) against the rule scorer it replaces.

    python benchmarks/bench_reward_judge.py [--steps 5] [--requests 64]

1. **Router throughput**: the demo's tiny Qwen2 served as a judge (one replica, hf engine, fp32, on a pool of its
   own) behind the router; ``--requests`` chat completions of 16 tokens (``ignore_eos``), sent one at a time and 16
   at once: requests/s and generated tokens/s, as a judge function sees them.
2. **Step time a judge adds**: the built-in demo (``python -m verl.trainer.main_ppo``, tiny model, sync, GRPO) scored
   by its rule (``verl/arithmetic``), then by the same tiny model served as a judge — on a pool of its own, and
   beside the training worker — through a veRL-style judge function (one chat request of 8 tokens per sample),
   called by the ``naive`` manager (in ``reward.num_workers`` = 1 scoring process: one judge call at a time) and by
   ``rate_limited`` (each sample's call as it finishes, 16 at most at once).
   Medians over the steps after the first: the step, generation with its streamed scoring (``gen``), the reward
   stage left after it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import tempfile
import time

from bench_e2e import run_trainer  # benchmarks/, next to this script

JUDGE = """
import json, urllib.request

def compute_score(data_source, solution_str, ground_truth, extra_info=None, reward_router_address=None):
    prompt = f"Answer: {solution_str}\\nReference: {ground_truth}\\nReply 'score: 1' if correct, else 'score: 0'."
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 8, "temperature": 0}
    request = urllib.request.Request(f"http://{reward_router_address}/v1/chat/completions",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        verdict = json.load(reply)["choices"][0]["message"]["content"]
    return float("score: 1" in verdict)
"""


def router_throughput(model_path: str, requests: int) -> list[tuple[int, float, float]]:
    """(concurrency, requests/s, tokens/s) through the router to one replica."""
    import aiohttp
    import ray

    from verl.experimental.reward_loop.reward_model import RewardModelManager
    from verl.experimental.reward_loop.router import reward_router
    from verl.single_controller.ray import RayResourcePool
    from verl.trainer.config.compose import compose_config

    config = compose_config("ppo_trainer")
    config.actor_rollout_ref.model.path = model_path
    rm = config.reward.reward_model
    rm.enable, rm.model_path = True, model_path
    rm.rollout.dtype, rm.rollout.prompt_length, rm.rollout.response_length = "float32", 128, 16
    config.actor_rollout_ref.rollout.ignore_eos = True
    ray.init(num_cpus=4, include_dashboard=False, runtime_env={"env_vars": {"RAY_AUTH_MODE": "disabled"}})
    router, address = reward_router(config)
    pool = RayResourcePool([1], use_gpu=False, max_colocate_count=1, name_prefix="reward_pool")
    manager = RewardModelManager(config, pool, router)
    body = {"messages": [{"role": "user", "content": "What is 3 + 4? Reply 'score: 1'."}], "max_tokens": 16}

    async def send(session: aiohttp.ClientSession, index: int) -> int:
        async with session.post(f"http://{address}/v1/chat/completions", json={**body, "seed": index}) as reply:
            return (await reply.json())["usage"]["completion_tokens"]

    async def run(concurrency: int) -> tuple[float, int]:
        limit = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession() as session:

            async def one(i: int) -> int:
                async with limit:
                    return await send(session, i)

            await one(-1)  # warm-up
            start = time.perf_counter()
            tokens = sum(await asyncio.gather(*(one(i) for i in range(requests))))
            return time.perf_counter() - start, tokens

    out = []
    for concurrency in (1, 16):
        seconds, tokens = asyncio.run(run(concurrency))
        out.append((concurrency, requests / seconds, tokens / seconds))
    manager.worker_group.shutdown()
    ray.shutdown()
    return out


def step_times(steps: int) -> list[tuple[str, dict[str, float]]]:
    """Medians of the step, gen and reward stages for the rule and the judge placements."""
    from verl.utils.demo import ensure_demo_assets

    model = ensure_demo_assets().model_path
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_judge-") as tmp:
        judge = os.path.join(tmp, "judge.py")
        with open(judge, "w") as f:
            f.write(JUDGE)
        served = {
            "reward.custom_reward_function.path": judge,
            "reward.reward_model.enable": "true",
            "reward.reward_model.model_path": model,
            "reward.reward_model.rollout.dtype": "float32",
            "reward.reward_model.rollout.response_length": "8",
        }
        own_pool = {
            "reward.reward_model.enable_resource_pool": "true",
            "reward.reward_model.n_gpus_per_node": "1",
            "reward.reward_model.nnodes": "1",
        }
        concurrent = {"reward.reward_manager.name": "rate_limited", "+reward.max_concurrent": "16"}
        for label, keys in (
            ("rule (verl/arithmetic)", {}),
            ("judge, own pool", {**served, **own_pool}),
            ("judge, beside the trainer", served),
            ("judge, own pool, rate_limited (16 at once)", {**served, **own_pool, **concurrent}),
        ):
            work = os.path.join(tmp, label.split(",")[0].split(" ")[0] + str(len(rows)))
            os.makedirs(work)
            records, _ = run_trainer(work, "hf", steps, keys)
            timed = records[1:]

            def median(key: str, values: list[dict] = timed) -> float:
                found = [r[key] for r in values if key in r]
                return statistics.median(found) if found else float("nan")

            rows.append((label, {k: median(f"timing_s/{k}") for k in ("step", "gen", "reward")}))
            print(json.dumps({"run": label, **rows[-1][1]}), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--requests", type=int, default=64)
    args = parser.parse_args()
    from verl.utils.demo import ensure_demo_assets

    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print("\n## Router throughput (tiny judge, one replica, 16 tokens per request)\n")
    print("| requests at once | requests/s | tokens/s |\n|---:|---:|---:|")
    for concurrency, rps, tps in router_throughput(ensure_demo_assets().model_path, args.requests):
        print(f"| {concurrency} | {rps:.1f} | {tps:.0f} |", flush=True)
    print(f"\n## Step time (demo, sync, {args.steps} steps, medians after step 1)\n")
    rows = step_times(args.steps)
    print("| scored by | step s | gen (+ streamed scoring) s | reward stage s |\n|---|---:|---:|---:|")
    for label, t in rows:
        print(f"| {label} | {t['step']:.2f} | {t['gen']:.2f} | {t['reward']:.3f} |")


if __name__ == "__main__":
    main()
