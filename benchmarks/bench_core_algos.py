"""Time every advantage estimator: the vectorized library code vs the plain loop reference of the tests.

    python benchmarks/bench_core_algos.py                       # 64k responses × 1k tokens in 4k groups of 16
    python benchmarks/bench_core_algos.py --responses 8192 --tokens 256 --repeats 1   # a quick run

The batch is fp32, right-padded (random lengths), with an outcome reward on the last token. Each vectorized
estimator is run once to warm up, then ``--repeats`` times; the best time is reported. The loop reference
(tests/trainer/ppo/algo_reference.py: Python loops over samples, groups and tokens) is far too slow for the full
batch, so it is timed on a subset of whole groups and its time is multiplied by full/subset (its cost is linear in
the number of groups); the output says which rows were extrapolated and by how much.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "trainer" / "ppo"))
import algo_reference as ref  # noqa: E402

from verl.trainer.ppo import core_algos  # noqa: E402

# Loop-reference subset per estimator, in responses: small enough that each loop run takes seconds.
SUBSET = {
    "optimal_token_baseline": 256,
    "tir_optimal_token_baseline": 256,
}
DEFAULT_SUBSET = 1024


def make_batch(n: int, width: int, group_size: int, seed: int = 0) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (n,), generator=g)
    mask = (torch.arange(width) < lengths[:, None]).float()
    rewards = torch.zeros(n, width)
    rewards[torch.arange(n), lengths - 1] = torch.randint(0, 2, (n,), generator=g).float()
    return {
        "token_level_rewards": rewards,
        "response_mask": mask,
        "index": np.array([f"uid-{i // group_size}" for i in range(n)], dtype=object),
        "values": torch.randn(n, width, generator=g),
        "reward_baselines": torch.rand(n, generator=g),
        "old_log_probs": -torch.rand(n, width, generator=g) * 3,
        "sum_pi_squared": torch.rand(n, width, generator=g) * 0.5,
    }


def subset(batch: dict[str, object], n: int) -> dict[str, object]:
    return {k: v[:n] for k, v in batch.items()}


GAMMA, LAM = 1.0, 0.95


def vectorized_call(name: str, batch: dict) -> Callable[[], object]:
    fn = core_algos.get_adv_estimator_fn(name)
    kwargs = dict(batch, gamma=GAMMA, lam=LAM, config=core_algos_config())
    return lambda: fn(**kwargs)


def core_algos_config():
    from verl.trainer.config import AlgoConfig

    return AlgoConfig(gamma=GAMMA, lam=LAM)


def reference_call(name: str, b: dict) -> Callable[[], object]:
    r, m, idx = b["token_level_rewards"], b["response_mask"], b["index"]
    calls = {
        "gae": lambda: ref.gae(r, b["values"], m, GAMMA, LAM),
        "grpo": lambda: ref.grpo(r, m, idx),
        "grpo_vectorized": lambda: ref.grpo(r, m, idx),
        "grpo_passk": lambda: ref.grpo_passk(r, m, idx),
        "reinforce_plus_plus": lambda: ref.reinforce_plus_plus(r, m, GAMMA),
        "reinforce_plus_plus_baseline": lambda: ref.reinforce_plus_plus_baseline(r, m, idx),
        "remax": lambda: ref.remax(r, b["reward_baselines"], m),
        "rloo": lambda: ref.rloo(r, m, idx),
        "rloo_vectorized": lambda: ref.rloo(r, m, idx, singleton_keeps_score=False),
        "opo": lambda: ref.opo(r, m, idx),
        "gpg": lambda: ref.gpg(r, m, idx),
        "optimal_token_baseline": lambda: ref.optimal_token_baseline(
            r, m, idx, b["old_log_probs"], b["sum_pi_squared"]
        ),
        "tir_optimal_token_baseline": lambda: ref.optimal_token_baseline(
            r, m, idx, b["old_log_probs"], b["sum_pi_squared"], zero_tail=True, multi_turn=True
        ),
    }
    return calls[name]


def per_sample_torch_loop_grpo(token_level_rewards, response_mask, index, epsilon=1e-6):
    """GRPO written the naive way: a Python loop over samples collecting 0-d tensors per group, torch mean/std per
    group, and a second loop writing each sample's advantage (the structure of veRL's non-vectorized GRPO)."""
    scores = token_level_rewards.sum(dim=-1)
    members: dict[object, list[int]] = {}
    for i in range(scores.shape[0]):
        members.setdefault(index[i], []).append(i)
    stats = {}
    for uid, rows in members.items():
        group = torch.stack([scores[i] for i in rows])
        stats[uid] = (torch.tensor(0.0), torch.tensor(1.0)) if len(rows) == 1 else (group.mean(), group.std())
    for i in range(scores.shape[0]):
        mean, std = stats[index[i]]
        scores[i] = (scores[i] - mean) / (std + epsilon)
    return scores.unsqueeze(-1) * response_mask


def best_time(fn: Callable[[], object], repeats: int, warmup: bool = True) -> float:
    if warmup:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def report(name: str, vectorized: float, loop: float) -> None:
    print(
        f"{name:30s} vectorized {vectorized:8.3f} s   loop {loop:9.1f} s   ratio {loop / vectorized:8.0f}x", flush=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--responses", type=int, default=65536)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--group-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--estimators", nargs="*", default=sorted(core_algos.ADV_ESTIMATOR_REGISTRY))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    n, width = args.responses, args.tokens
    print(f"# bench_core_algos: {n} responses x {width} tokens, {n // args.group_size} groups of {args.group_size}")
    print(f"# torch {torch.__version__}, {args.threads} threads, {platform.processor() or platform.machine()}")
    batch = make_batch(n, width, args.group_size)
    rows = []
    for name in args.estimators:
        vec = best_time(vectorized_call(name, batch), args.repeats)
        sub_n = min(n, SUBSET.get(name, DEFAULT_SUBSET))
        sub_n -= sub_n % args.group_size or 0
        loop_sub = best_time(reference_call(name, subset(batch, sub_n)), 1, warmup=False)
        scale = n / sub_n
        loop = loop_sub * scale
        rows.append((f"`{name}`", vec, loop, scale))
        report(name, vec, loop)

    if "grpo" in args.estimators:
        b = subset(batch, min(n, DEFAULT_SUBSET * 4))
        sub_n = b["response_mask"].shape[0]
        loop = best_time(
            lambda: per_sample_torch_loop_grpo(b["token_level_rewards"], b["response_mask"], b["index"]), 1
        )
        loop *= n / sub_n
        vec = next(v for label, v, _, _ in rows if label == "`grpo`")
        rows.append(("`grpo` vs a per-sample torch loop", vec, loop, n / sub_n))
        report("grpo vs per-sample torch loop", vec, loop)

    print()
    print("| estimator | vectorized (s) | loop reference (s) | speed-up | loop measured on |")
    print("|---|---:|---:|---:|---|")
    for label, vec, loop, scale in rows:
        measured = "full batch" if scale == 1 else f"1/{scale:.0f} of the groups, x{scale:.0f}"
        print(f"| {label} | {vec:.3f} | {loop:.1f} | {loop / vec:,.0f}x | {measured} |")


if __name__ == "__main__":
    main()
