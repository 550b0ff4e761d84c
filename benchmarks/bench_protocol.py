"""DataProto throughput: chunk, concat and pickling of a 4096 x 2048 batch, against plain torch.save / torch.load.

    python benchmarks/bench_protocol.py [--rows 4096] [--cols 2048] [--repeats 3] [--no-ray]

Prints one table (median seconds and GB/s of tensor payload). The batch holds the keys a PPO step moves:
input_ids, attention_mask, position_ids (int64) and old_log_probs (float32), plus a per-row ``uid`` string.
"""

from __future__ import annotations

import argparse
import io
import os
import pickle
import platform
import statistics
import time

import numpy as np
import torch

from verl.protocol import DataProto


def make_batch(rows: int, cols: int) -> DataProto:
    g = torch.Generator().manual_seed(0)
    return DataProto.from_dict(
        tensors={
            "input_ids": torch.randint(0, 32000, (rows, cols), generator=g),
            "attention_mask": torch.ones(rows, cols, dtype=torch.int64),
            "position_ids": torch.arange(cols).expand(rows, cols).contiguous(),
            "old_log_probs": torch.randn(rows, cols, generator=g),
        },
        non_tensors={"uid": np.array([f"uid-{i}" for i in range(rows)], dtype=object)},
    )


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=2048)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-ray", action="store_true", help="skip the ray.put / ray.get round trip")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    data = make_batch(args.rows, args.cols)
    payload = sum(v.numel() * v.element_size() for v in data.batch.values())
    plain = {k: v for k, v in data.batch.items()} | {"uid": list(data.non_tensor_batch["uid"])}
    parts = data.chunk(args.chunks)
    blob = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)

    def torch_save() -> bytes:
        buf = io.BytesIO()
        torch.save(plain, buf)
        return buf.getvalue()

    saved = torch_save()
    rows = [
        (f"chunk into {args.chunks}", timed(lambda: data.chunk(args.chunks), args.repeats), False),
        (f"concat {args.chunks} chunks", timed(lambda: DataProto.concat(parts), args.repeats), True),
        ("pickle.dumps(DataProto)", timed(lambda: pickle.dumps(data, protocol=5), args.repeats), True),
        ("pickle.loads(DataProto)", timed(lambda: pickle.loads(blob), args.repeats), True),
        ("torch.save(dict) [baseline]", timed(torch_save, args.repeats), True),
        ("torch.load(dict) [baseline]", timed(lambda: torch.load(io.BytesIO(saved)), args.repeats), True),
    ]
    if not args.no_ray:
        import ray

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, object_store_memory=max(4 * payload, 2**30))

        def ray_round_trip() -> None:
            ray.get(ray.put(data))

        rows.append(("ray.put + ray.get(DataProto)", timed(ray_round_trip, args.repeats), True))
        rows.append(("ray.put + ray.get(dict) [baseline]", timed(lambda: ray.get(ray.put(plain)), args.repeats), True))
        ray.shutdown()

    print(
        f"# bench_protocol: {args.rows} x {args.cols} batch, {payload / 2**20:.0f} MiB of tensors, "
        f"{len(data.non_tensor_batch['uid'])} uids; torch {torch.__version__}, {os.cpu_count()} CPUs, "
        f"{platform.processor() or platform.machine()}; median of {args.repeats}"
    )
    print(f"{'operation':38s} {'seconds':>9s} {'GB/s':>8s}")
    for name, seconds, moves_payload in rows:
        rate = f"{payload / seconds / 1e9:8.2f}" if moves_payload else f"{'-':>8s}"
        print(f"{name:38s} {seconds:9.4f} {rate}")
    print(f"pickled size: DataProto {len(blob) / 2**20:.1f} MiB, torch.save {len(saved) / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
