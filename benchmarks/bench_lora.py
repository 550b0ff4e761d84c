"""LoRA against full fine-tuning: GRPO with ``main_ppo`` on the same workload, back to back on this machine.

    python benchmarks/bench_lora.py [--workloads tiny smollm2] [--dtypes fp32 bf16] [--ranks 16]

The workloads and settings are ``bench_vs_trl.py``'s (GRPO, no KL, one update per batch, the hf engine, one worker);
the LoRA runs add ``actor_rollout_ref.model.lora_rank=<r>``, ``lora_alpha=2r`` on every linear layer of the decoder.
Printed per run: the median s/step after the warm-up and the stages that LoRA changes (update_actor, gen,
update_weights), the peak summed PSS of every process of the run and of the training worker alone, and what each
weight push moves (``weight_sync/bytes``, ``weight_sync/seconds``: the pushes inside the steps; with LoRA these carry
the adapters only, the base weights went once at start-up).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile

from bench_vs_trl import WORKLOADS, prepare_workload, print_per_process, run_ours  # benchmarks/, next to this script


def lora_overrides(rank: int) -> dict[str, str]:
    return {"actor_rollout_ref.model.lora_rank": str(rank), "actor_rollout_ref.model.lora_alpha": str(2 * rank)}


def median_of(steps: list[dict], key: str) -> float:
    return statistics.median(s.get(key, float("nan")) for s in steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--dtypes", nargs="+", default=["fp32"], choices=["fp32", "bf16"])
    parser.add_argument("--ranks", nargs="+", type=int, default=[16], help="LoRA ranks to run beside full FT")
    parser.add_argument("--skip-full", action="store_true", help="run the LoRA ranks only")
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="bench_lora-") as tmp:
        for name in args.workloads:
            prepared = prepare_workload(name, tmp)
            if prepared is None:
                continue
            spec, model, train_file, _ = prepared
            for dtype in args.dtypes:
                for rank in [0] * (not args.skip_full) + list(args.ranks):
                    label = "full" if rank == 0 else f"lora r={rank}"
                    work = tempfile.mkdtemp(dir=tmp, prefix=f"{name}-{dtype}-{rank}-")
                    extra = lora_overrides(rank) if rank else {}
                    result = run_ours(work, spec, model, train_file, dtype, extra=extra)
                    results.append({"workload": name, "dtype": dtype, "run": label, **result})
                    print(f"{name} {dtype} {label}: {result['step_s']:.3f} s/step", flush=True)
    print_report(results)


def print_report(results: list[dict]) -> None:
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(
        "\n| workload | dtype | run | s/step | update_actor s | gen s | update_weights s | push MiB | push s | "
        "peak memory, all processes (MiB) | training worker (MiB) |"
    )
    print("|---|---|---|" + "---:|" * 8)
    for r in results:
        steps = r["steps"]
        worker = max((mib for label, (_, mib) in r["memory"].per_process().items() if "WorkerDict" in label), default=0)
        print(
            f"| {r['workload']} | {r['dtype']} | {r['run']} | {r['step_s']:.3f} | {r['stages']['update_actor']:.3f} | "
            f"{r['stages']['gen']:.3f} | {r['stages']['update_weights']:.3f} | "
            f"{median_of(steps, 'weight_sync/bytes') / 2**20:.2f} | {median_of(steps, 'weight_sync/seconds'):.4f} | "
            f"{r['memory'].peak_mib:,.0f} | {worker:,.0f} |"
        )
    print_per_process(results, "run")


if __name__ == "__main__":
    sys.exit(main())
