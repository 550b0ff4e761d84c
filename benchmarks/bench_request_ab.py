"""The request path against the old batch decode loop in one process, so machine drift between processes drops out.

    python benchmarks/bench_request_ab.py --old-tree /tmp/bench_old [--prompts 16 64] [--repeats 6]
    .venv-vllm/bin/python benchmarks/bench_request_ab.py --engine vllm

``bench_request.py`` compares the two paths across processes (an old tree on ``PYTHONPATH``), where run-to-run drift
on a shared 2-core machine is ±5-10%. Here both sides share one process and alternate:

* ``hf``: the batch decode loop of the old ``HFRollout`` (its ``hf_rollout.py`` loaded from ``--old-tree``, a
  worktree of the commit before the request API, e.g. ``git worktree add /tmp/bench_old bd59619``) against today's
  ``generate_sequences`` (the thin layer over the request API), both on the same model folder;
* ``vllm``: ``LLM.generate`` over the batch (what the old ``generate_sequences`` called) against the request path,
  on one engine.

The workload is ``bench_request.py``'s ``single``: random prompts of 16-32 tokens, exactly 128 new tokens each,
temperature 1, top-k 50, bf16, the ~5M Qwen2. Prints the median seconds and the request/old ratio per batch size.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from collections.abc import Callable

from bench_rollout import TINY_5M, TOP_K, make_prompts  # benchmarks/bench_rollout.py, next to this script

from verl.protocol import DataProto
from verl.utils.tiny_model import save_tiny_qwen2
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout import get_rollout_class

NEW_TOKENS = 128


def old_hf_class(tree: str) -> type:
    """The old tree's ``HFRollout`` under another name (its registration line dropped: "hf" is taken)."""
    path = os.path.join(tree, "verl/workers/rollout/hf_rollout.py")
    source = open(path).read().replace('@register_rollout("hf")\n', "")
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("old_hf_rollout", loader=None))
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - a benchmark loading a known file
    return module.HFRollout


def vllm_batch_call(engine, prompts: DataProto) -> Callable[[], None]:
    """The old ``generate_sequences``' call: one ``LLM.generate`` over all prompts, one seeded request each."""
    from vllm import SamplingParams

    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    requests = [{"prompt_token_ids": ids[i][mask[i]].tolist()} for i in range(len(ids))]
    params = [
        SamplingParams(n=1, temperature=1.0, top_k=TOP_K, max_tokens=NEW_TOKENS, logprobs=0, seed=i, ignore_eos=True)
        for i in range(len(ids))
    ]
    return lambda: engine.llm.generate(requests, sampling_params=params, use_tqdm=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf")
    parser.add_argument("--old-tree", default="/tmp/bench_old", help="hf: a tree of the commit before the request API")
    parser.add_argument("--prompts", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = save_tiny_qwen2(os.path.join(tmp, "qwen2-5m"), seed=0, **TINY_5M)
        config = RolloutConfig(
            name=args.engine,
            tensor_model_parallel_size=1,
            prompt_length=32,
            response_length=NEW_TOKENS,
            temperature=1.0,
            top_k=TOP_K,
            ignore_eos=True,
            dtype="bfloat16",
            load_format="auto",
            max_num_seqs=256,
        )
        engine = get_rollout_class(args.engine)(config, model_dir)
        old_engine = old_hf_class(args.old_tree)(config, model_dir) if args.engine == "hf" else None
        print("| engine | prompts | old batch loop (s) | request path (s) | request / old (tok/s) |")
        print("|---|---:|---:|---:|---:|")
        for count in args.prompts:
            prompts = make_prompts(count, 32, TINY_5M["vocab_size"], 0)
            prompts.meta_info = {"global_steps": 1}
            if old_engine is not None:
                old = lambda p=prompts: old_engine.generate_sequences(p)  # noqa: E731
            else:
                old = vllm_batch_call(engine, prompts)
            new = lambda p=prompts: engine.generate_sequences(p)  # noqa: E731
            old(), new()  # warm-up
            times: dict[str, list[float]] = {"old": [], "new": []}
            for _ in range(args.repeats):
                for name, fn in (("old", old), ("new", new)):
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            t_old, t_new = statistics.median(times["old"]), statistics.median(times["new"])
            print(f"| {args.engine} | {count} | {t_old:.2f} | {t_new:.2f} | {t_old / t_new:.2f} |", flush=True)
        engine.close()


if __name__ == "__main__":
    main()
