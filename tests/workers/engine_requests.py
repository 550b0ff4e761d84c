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
from verl.workers.rollout.request import gather_output, plan_generation, plan_requests


def generate(wg: Any, prompts: DataProto, rollout: Any, vocab_size: int = 256) -> DataProto:
    """``n`` responses per row of ``prompts`` (meta keys as the engines' batch call reads them) from the engines of
    ``wg``, sampled as ``rollout`` (the ``actor_rollout_ref.rollout`` section) says; rank r serves the r-th
    contiguous share of the rows."""
    plan = plan_generation(prompts, build_rollout_config(rollout), [], None, vocab_size)
    requests = plan_requests(plan, uuid.uuid4().hex)
    ranks = len(wg.workers)
    per_rank = -(-plan.rows // ranks) * plan.n  # samples of ceil(rows / ranks) rows
    outputs: list[Any] = [None] * len(requests)
    for rank, worker in enumerate(wg.workers):
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
