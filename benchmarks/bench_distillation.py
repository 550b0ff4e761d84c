"""The step time a distillation teacher adds.

    python benchmarks/bench_distillation.py [--steps 6]

The built-in demo (``python -m verl.trainer.main_ppo``: tiny Qwen2, sync, GRPO, 16 prompts × 4 samples, hf engine)
without a teacher, then distilling from the same model served as a teacher on a pool of its own (one replica):
with a single-sample estimator (``k3``: the teacher sends each sampled token's log-prob) and with
``forward_kl_topk`` at k = 16 and k = 64 (the teacher sends its top-k at each position; the student's update
computes the KL over them from its logits). Each teacher query runs as its sample finishes, inside generation
(``gen``); the update carries the loss (``update_actor``). Medians over the steps after the first. (veRL 0.10 has
no teacher beside the trainer: the teacher always has a pool of its own.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile

from bench_e2e import run_trainer  # benchmarks/, next to this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    from verl.utils.demo import ensure_demo_assets

    model = ensure_demo_assets().model_path
    teacher = {
        "distillation.enabled": "true",
        "distillation.n_gpus_per_node": "1",
        "distillation.nnodes": "1",
        "distillation.teacher_models.teacher_model.model_path": model,
    }
    runs = [
        ("no teacher", {}),
        ("teacher, k3 (sampled token)", {**teacher, "distillation.distillation_loss.loss_mode": "k3"}),
    ]
    for k in (16, 64):
        topk = {"distillation.distillation_loss.loss_mode": "forward_kl_topk", "distillation.distillation_loss.topk": k}
        runs.append((f"teacher, forward_kl_topk k={k}", {**teacher, **topk}))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(f"\n## Step time (demo, sync, {args.steps} steps, medians after step 1)\n")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_distill-") as tmp:
        for i, (label, keys) in enumerate(runs):
            work = os.path.join(tmp, str(i))
            os.makedirs(work)
            records, _ = run_trainer(work, "hf", args.steps, {k: str(v) for k, v in keys.items()})
            timed = records[1:]
            medians = {
                stage: statistics.median(r[f"timing_s/{stage}"] for r in timed)
                for stage in ("step", "gen", "update_actor")
            }
            rows.append((label, medians))
            print(json.dumps({"run": label, **medians}), flush=True)
    print("| run | step s | gen (+ teacher queries) s | update_actor s |\n|---|---:|---:|---:|")
    for label, t in rows:
        print(f"| {label} | {t['step']:.3f} | {t['gen']:.3f} | {t['update_actor']:.3f} |")


if __name__ == "__main__":
    main()
