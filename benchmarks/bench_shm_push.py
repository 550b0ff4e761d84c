"""The weight push into a rollout engine of another process (``shm`` and ``gloo`` backends) against the in-process one
(``naive``).

    python benchmarks/bench_shm_push.py [--sizes small,medium] [--bucket-mb 64,512] [--repeats 3]

The trainer's float32 state dict (a Qwen2 built offline, sizes as ``bench_weight_sync.py``) is pushed, cast to
bf16, into an hf rollout engine: ``naive`` into an engine in this process; ``shm`` into an engine in a Ray actor on
this node through one file in ``/dev/shm`` (each bucket written by this process, then one Ray call with the
tensors' offsets; the other process loads views of its mapping); ``gloo`` into an engine in a Ray actor through a
process group of the push's own (one broadcast per bucket, as to a rollout replica on another pool or node). Seconds
per push, with and without bit-exact verification (``shm`` and ``gloo`` digest on the engine's side), median of
``--repeats``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import ray
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_weight_sync import SIZES  # noqa: E402

from verl.checkpoint_engine import get_checkpoint_engine  # noqa: E402
from verl.checkpoint_engine.collective import BroadcastReceiver, BroadcastSender, weight_group  # noqa: E402
from verl.checkpoint_engine.shm import ShmRolloutClient, ShmWeightReceiver  # noqa: E402
from verl.utils.net_utils import node_ip_and_free_port  # noqa: E402
from verl.utils.tiny_model import save_tiny_qwen2  # noqa: E402
from verl.workers.rollout import get_rollout_class  # noqa: E402

ROLLOUT = {"name": "hf", "dtype": "bfloat16", "response_length": 8, "prompt_length": 8}


@ray.remote(num_cpus=0)
class RolloutProcess:
    """The hf engine in its own process, with the receiving end of the shared buffer."""

    def __init__(self, model_dir: str, path: str, nbytes: int) -> None:
        torch.set_num_threads(1)
        self.receiver = ShmWeightReceiver(get_rollout_class("hf")(config=ROLLOUT, model_path=model_dir), path, nbytes)

    def call(self, method: str, *args):
        return getattr(self.receiver, method)(*args)


@ray.remote(num_cpus=0)
class GlooReplica:
    """The hf engine in its own process, rank 1 of the push's process group."""

    def __init__(self, model_dir: str) -> None:
        torch.set_num_threads(1)
        self.rollout = get_rollout_class("hf")(config=ROLLOUT, model_path=model_dir)

    def join(self, host: str, port: int) -> None:
        self.receiver = BroadcastReceiver(weight_group(host, port, 1, 2), self.rollout)

    def receive(self) -> int | None:
        return self.receiver.receive()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench(model_dir: str, weights: dict[str, torch.Tensor], bucket_mb: int, repeats: int) -> dict[str, float]:
    config = {"update_weights_bucket_megabytes": bucket_mb}
    naive = get_checkpoint_engine({"backend": "naive", **config}, dtype="bfloat16")
    shm = get_checkpoint_engine({"backend": "shm", **config}, dtype="bfloat16")
    local = get_rollout_class("hf")(config=ROLLOUT, model_path=model_dir)
    client = ShmRolloutClient(lambda method, *args: ray.get(actor.call.remote(method, *args)), shm.bucket_bytes)
    actor = RolloutProcess.remote(model_dir, client.path, client.buffer.nbytes)

    gloo = get_checkpoint_engine({"backend": "gloo", **config}, dtype="bfloat16")
    replica = GlooReplica.remote(model_dir)
    host, port = node_ip_and_free_port()
    joined = replica.join.remote(host, port)
    sender = BroadcastSender(weight_group(host, port, 0, 2))
    ray.get(joined)

    def push(engine, target, verify):
        received = replica.receive.remote() if target is sender else None
        with target.weight_update():
            engine.send_weights(weights.items(), target, verify=verify)
        if received is not None:
            ray.get(received)

    results: dict[str, list[float]] = {k: [] for k in ("naive", "naive_verified", "shm", "shm_verified", "gloo")}
    results["gloo_verified"] = []
    push(shm, client, False)  # warm-up: the other process maps the file
    push(gloo, sender, False)
    for _ in range(repeats):
        results["naive"].append(timed(lambda: push(naive, local, False)))
        results["naive_verified"].append(timed(lambda: push(naive, local, True)))
        results["shm"].append(timed(lambda: push(shm, client, False)))
        results["shm_verified"].append(timed(lambda: push(shm, client, True)))
        results["gloo"].append(timed(lambda: push(gloo, sender, False)))
        results["gloo_verified"].append(timed(lambda: push(gloo, sender, True)))
    closed = replica.receive.remote()
    sender.close()
    ray.get(closed)
    ray.kill(actor)
    ray.kill(replica)
    client.close()
    return {k: statistics.median(v) for k, v in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="small,medium")
    parser.add_argument("--bucket-mb", default="64,512")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.sizes.split(","):
            model_dir = save_tiny_qwen2(os.path.join(workdir, name), seed=0, **SIZES[name])
            weights = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
            gb = sum(t.numel() * 2 for t in weights.values()) / 1e9
            params = sum(t.numel() for t in weights.values()) / 1e6
            for bucket in (int(b) for b in args.bucket_mb.split(",")):
                rows.append((name, params, gb, bucket, bench(model_dir, weights, bucket, args.repeats)))
    ray.shutdown()
    print(
        f"# bench_shm_push: fp32 -> hf engine bf16; median of {args.repeats}; 1 torch thread per process; "
        f"torch {torch.__version__}, {os.cpu_count()} CPUs"
    )
    print(
        f"{'model':8s} {'params':>8s} {'GB':>6s} {'bucket MiB':>10s} {'naive s':>8s} {'shm s':>7s} "
        f"{'shm s/GB':>8s} {'gloo s':>7s} {'naive+verify s':>14s} {'shm+verify s':>12s} {'gloo+verify s':>13s}"
    )
    for name, params, gb, bucket, r in rows:
        print(
            f"{name:8s} {params:7.1f}M {gb:6.3f} {bucket:10d} {r['naive']:8.3f} {r['shm']:7.3f} "
            f"{r['shm'] / gb:8.2f} {r['gloo']:7.3f} {r['naive_verified']:14.3f} {r['shm_verified']:12.3f} "
            f"{r['gloo_verified']:13.3f}"
        )


if __name__ == "__main__":
    main()
