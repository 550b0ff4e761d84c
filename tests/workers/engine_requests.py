"""Batch generation for the worker tests, over the request API the trainer's agent loops use: a worker group has no
batch ``generate_sequences`` of its own (the trainer routes ``actor_rollout_wg.generate_sequences`` to its agent-loop
manager), so these tests send each rank's share of the samples to that rank's engine as one ``generate_wave``."""

from __future__ import annotations

import uuid
from typing import Any

import ray

from verl.experimental.agent_loop.server_manager import ServerHandle
from verl.protocol import DataProto
from verl.workers.config.builders import build_rollout_config
from verl.workers.rollout.request import as_id_list, gather_output, plan_generation, plan_requests


def model_defaults(model_path: str) -> tuple[list[int], int | None, int]:
    """The eos ids, pad id and vocabulary size an engine of ``model_path`` defaults to."""
    from transformers import AutoConfig, GenerationConfig

    config = AutoConfig.from_pretrained(model_path)
    try:
        generation = GenerationConfig.from_pretrained(model_path)
    except OSError:
        generation = None
    eos = getattr(generation, "eos_token_id", None)
    pad = getattr(generation, "pad_token_id", None)
    eos = as_id_list(eos if eos is not None else config.eos_token_id)
    return eos, pad if pad is not None else config.pad_token_id, config.vocab_size


def generate(
    wg: Any, prompts: DataProto, rollout: Any, model_path: str | None = None, ranks: list[int] | None = None
) -> DataProto:
    """``n`` responses per row of ``prompts`` (meta keys as the engines' batch call reads them; eos, pad and the
    vocabulary from ``model_path`` when given) from the engines of ``wg`` (or of its ``ranks``), sampled as
    ``rollout`` (the ``actor_rollout_ref.rollout`` section) says; the i-th engine serves the i-th contiguous share
    of the rows."""
    eos, pad, vocab = model_defaults(model_path) if model_path else ([], None, 1 << 30)
    plan = plan_generation(prompts, build_rollout_config(rollout), eos, pad, vocab)
    requests = plan_requests(plan, uuid.uuid4().hex)
    workers = [wg.workers[r] for r in (range(len(wg.workers)) if ranks is None else ranks)]
    per_rank = -(-plan.rows // len(workers)) * plan.n  # samples of ceil(rows / engines) rows
    outputs: list[Any] = [None] * len(requests)
    for rank, worker in enumerate(workers):
        first = rank * per_rank
        share = [
            {"request_id": rid, "prompt_ids": ids, "sampling_params": params}
            for rid, ids, params, _ in requests[first : first + per_rank]
        ]
        if not share:
            continue
        handle = ServerHandle(worker, getattr(wg, "method_prefix", ""))
        for ref in handle.generate_wave.options(num_returns="streaming").remote(share):
            index, output = ray.get(ref)
            outputs[first + index] = output
    return gather_output(prompts, plan, outputs)
