"""From per-sample :class:`AgentLoopOutput` s to the batch the trainer consumes, and the agent-loop metrics.

Prompts are left-padded to ``rollout.prompt_length`` and responses right-padded to ``rollout.response_length``
(veRL's layout). Output tensors: ``prompts``, ``responses``, ``input_ids``, ``attention_mask``, ``position_ids``,
``response_mask`` (1 on the tokens the model generated, 0 on tool / user tokens and padding), ``rollout_log_probs``
(when every loop returned log-probs) and ``rm_scores`` (when every sample was scored); non-tensor columns:
``__num_turns__``, ``__trajectory_index__`` (see below), ``weight_version_ranges`` (see :func:`version_ranges`), each
``reward_extra_info`` key, and every
``extra_fields`` key — always with :data:`STABLE_EXTRA_FIELDS` among them (None where a sample has no value, as in
veRL), so that the batches of different agent loops concatenate.

**Multi-output sessions** (veRL 0.10): a loop's ``run`` may return a list of outputs, one sample's trajectories in
order (the last is the session's final output). Each becomes a row; ``__trajectory_index__`` numbers a sample's rows
0, 1, … (veRL's ``{uid}_{session_id}_{index}`` key), so a row with index 0 starts a new sample
(:func:`session_numbers`); the trainer adds each row's ``session_id``, after which :func:`sessions` and
:func:`final_rows` hold in any row order. A loop returning one output gives one row with index 0.

:class:`_InternalAgentLoopOutput` is veRL's padded, tensor form of one output (importable from
``verl.experimental.agent_loop.agent_loop``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from pydantic import ConfigDict, field_validator, model_validator

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.protocol import DataProto
from verl.workers.rollout.request import sequence_tensors

__all__ = [
    "SESSION_ID",
    "STABLE_EXTRA_FIELDS",
    "TRAJECTORY_INDEX",
    "SampleResult",
    "agent_loop_metrics",
    "final_rows",
    "object_column",
    "pad_sample",
    "rows_to_tensors",
    "samples_to_batch",
    "session_numbers",
    "sessions",
    "trajectory_indices",
    "version_ranges",
]


# the column that flags the samples whose agent loop failed (verl.experimental.agent_loop.failures)
FAILED_COLUMN = "__failed__"

# the column numbering each sample's outputs (multi-output sessions): 0 for its first row
TRAJECTORY_INDEX = "__trajectory_index__"
# the trainer's column: each row's sample within its prompt group, [0, n) (veRL 0.10's trajectory field)
SESSION_ID = "session_id"

# extra_fields columns every batch has (veRL's), whichever loops produced it
STABLE_EXTRA_FIELDS = ("turn_scores", "tool_rewards", "min_global_steps", "max_global_steps", "extras")


@dataclass
class SampleResult:
    """One finished sample: the loop's output, its padded rows (plain lists, see :func:`pad_sample`), and its reward
    once scored."""

    agent_name: str
    output: AgentLoopOutput
    rows: dict[str, list]
    reward: torch.Tensor | None = None  # (1, response_length)
    reward_extra: dict[str, Any] = field(default_factory=dict)
    token_versions: list[int] = field(default_factory=list)  # the weight version of each generated token, in order
    failed: bool = False  # its agent loop raised: a placeholder row (verl.experimental.agent_loop.failures)
    index: int = 0  # its place among its sample's outputs (multi-output sessions; the last one is the final output)
    # on-policy distillation: the teacher's (ids, log-probs) at each response position, each (response_length, K)
    teacher: tuple[torch.Tensor, torch.Tensor] | None = None


def version_ranges(response_mask: Sequence[int], token_versions: Sequence[int]) -> list[list[int]]:
    """``[start, end, version]`` runs (end exclusive) over a sample's response positions: the k-th token the model
    generated (mask 1) has the k-th version of ``token_versions``; a tool or user token (mask 0) the version of the
    model token before it (the first one's at the start). Empty when no version was recorded."""
    if not token_versions:
        return []
    ranges: list[list[int]] = []
    generated, version = 0, int(token_versions[0])
    for position, mask in enumerate(response_mask):
        if mask:
            version = int(token_versions[min(generated, len(token_versions) - 1)])
            generated += 1
        if ranges and ranges[-1][2] == version:
            ranges[-1][1] = position + 1
        else:
            ranges.append([position, position + 1, version])
    return ranges


def session_numbers(batch: DataProto) -> np.ndarray:
    """Per row of a rollout in the agent loops' order, the number of the sample (session) it belongs to, counting
    from 0: a new one starts at every row whose ``__trajectory_index__`` is 0 (every row is its own sample in a batch
    without the column)."""
    index = batch.non_tensor_batch.get(TRAJECTORY_INDEX)
    if index is None:
        return np.arange(len(batch))
    index = np.asarray(index, dtype=np.int64)
    if len(index) and index[0] != 0:
        raise ValueError(f"the batch's first row has {TRAJECTORY_INDEX}={index[0]}: a sample's rows start at 0")
    return np.cumsum(index == 0) - 1


def sessions(batch: DataProto) -> np.ndarray:
    """Per row, its session as a number (0, 1, … in order of first appearance), in any row order where the batch
    names them (``uid`` and the trainer's ``session_id``), else by :func:`session_numbers`."""
    ids = batch.non_tensor_batch.get(SESSION_ID)
    if ids is None or "uid" not in batch.non_tensor_batch:
        return session_numbers(batch)
    numbers: dict[tuple[Any, int], int] = {}
    keys = zip(batch.non_tensor_batch["uid"], np.asarray(ids, dtype=np.int64).tolist(), strict=True)
    return np.array([numbers.setdefault(key, len(numbers)) for key in keys], dtype=np.int64)


def trajectory_indices(batch: DataProto) -> np.ndarray:
    """Per row, its ``__trajectory_index__`` (0 for every row of a batch without the column)."""
    index = batch.non_tensor_batch.get(TRAJECTORY_INDEX)
    return np.zeros(len(batch), dtype=np.int64) if index is None else np.asarray(index, dtype=np.int64)


def final_rows(batch: DataProto) -> np.ndarray:
    """The row of each session's final output (its highest ``__trajectory_index__``), in row order."""
    index = trajectory_indices(batch)
    best: dict[int, tuple[int, int]] = {}
    for row, (session, i) in enumerate(zip(sessions(batch).tolist(), index.tolist(), strict=True)):
        if session not in best or best[session][0] < i:
            best[session] = (i, row)
    return np.array(sorted(row for _, row in best.values()), dtype=np.int64)


def pad_sample(
    output: AgentLoopOutput, agent_name: str, prompt_length: int, response_length: int, pad_id: int
) -> dict[str, list]:
    """The sample's padded rows as lists: ``prompt_ids`` / ``prompt_mask`` (left-padded), ``responses`` /
    ``response_valid`` / ``response_mask`` / ``log_probs`` (right-padded; ``log_probs`` None without log-probs)."""
    prompt, response = output.prompt_ids, output.response_ids
    if not prompt:
        raise ValueError(f"agent loop {agent_name!r} returned an empty prompt")
    if len(prompt) > prompt_length:
        raise ValueError(
            f"agent loop {agent_name!r} returned a prompt of {len(prompt)} tokens, more than "
            f"actor_rollout_ref.rollout.prompt_length={prompt_length}"
        )
    if len(response) > response_length:
        raise ValueError(
            f"agent loop {agent_name!r} returned {len(response)} response tokens, more than "
            f"actor_rollout_ref.rollout.response_length={response_length}"
        )
    left, right = prompt_length - len(prompt), response_length - len(response)
    log_probs = output.response_logprobs
    return {
        "prompt_ids": [pad_id] * left + list(prompt),
        "prompt_mask": [0] * left + [1] * len(prompt),
        "responses": list(response) + [pad_id] * right,
        "response_valid": [1] * len(response) + [0] * right,
        "response_mask": list(output.response_mask) + [0] * right,
        "log_probs": None if log_probs is None else list(log_probs) + [0.0] * right,
    }


def rows_to_tensors(rows: Sequence[dict[str, list]]) -> dict[str, torch.Tensor]:
    """The contract's tensors of padded rows (``rollout_log_probs`` only when every row has log-probs)."""
    ints = {key: torch.tensor([r[key] for r in rows], dtype=torch.long) for key in _INT_ROWS}
    with_log_probs = all(r["log_probs"] is not None for r in rows)
    log_probs = torch.tensor([r["log_probs"] if with_log_probs else [] for r in rows], dtype=torch.float32)
    if not with_log_probs:
        log_probs = torch.zeros(ints["responses"].shape)
    tensors = sequence_tensors(
        ints["prompt_ids"],
        ints["prompt_mask"],
        ints["responses"],
        ints["response_valid"],
        ints["response_mask"],
        log_probs,
    )
    if not with_log_probs:
        del tensors["rollout_log_probs"]
    return tensors


_INT_ROWS = ("prompt_ids", "prompt_mask", "responses", "response_valid", "response_mask")


def samples_to_batch(results: Sequence[SampleResult], failed_column: bool = False) -> DataProto:
    """The batch of finished samples, in order (see the module docstring for its keys); with ``failed_column``, a
    ``__failed__`` column says which samples failed."""
    with_log_probs = {r.output.response_logprobs is not None for r in results}
    if len(with_log_probs) > 1:
        missing = sorted({r.agent_name for r in results if r.output.response_logprobs is None})
        raise ValueError(f"agent loops {missing} returned no response_logprobs while others did (all or none)")
    tensors = rows_to_tensors([r.rows for r in results])
    if all(r.reward is not None for r in results):
        tensors["rm_scores"] = torch.cat([r.reward for r in results])
    scored = [r.teacher for r in results if r.teacher is not None]
    if scored:  # veRL's teacher_ids / teacher_logprobs (a failed sample's rows are zeros)
        ids, log_probs = scored[0]
        empty = (torch.zeros_like(ids), torch.zeros_like(log_probs))
        tensors["teacher_ids"] = torch.stack([(r.teacher or empty)[0] for r in results])
        tensors["teacher_logprobs"] = torch.stack([(r.teacher or empty)[1] for r in results])
    non_tensors: dict[str, np.ndarray] = {
        "__num_turns__": np.array([r.output.num_turns for r in results], dtype=np.int32),
        TRAJECTORY_INDEX: np.array([r.index for r in results], dtype=np.int64),
        "weight_version_ranges": object_column(
            [version_ranges(r.output.response_mask, r.token_versions) for r in results]
        ),
    }
    reward_keys = _ordered_keys(r.reward_extra for r in results)
    for key in reward_keys:
        non_tensors[key] = object_column([r.reward_extra.get(key) for r in results])
    for key in _ordered_keys(r.output.extra_fields for r in results):
        if key not in non_tensors:
            non_tensors[key] = object_column([r.output.extra_fields.get(key) for r in results])
    for key, pick in (("min_global_steps", min), ("max_global_steps", max)):  # veRL 0.10's trajectory versions
        if key not in non_tensors and any(r.token_versions for r in results):
            non_tensors[key] = object_column([pick(r.token_versions) if r.token_versions else None for r in results])
    for key in STABLE_EXTRA_FIELDS:
        if key not in non_tensors:
            non_tensors[key] = object_column([None] * len(results))
    if failed_column:
        non_tensors[FAILED_COLUMN] = np.array([r.failed for r in results], dtype=bool)
    return DataProto.from_dict(tensors, non_tensors, meta_info={"reward_extra_keys": reward_keys})


class _InternalAgentLoopOutput(AgentLoopOutput):
    """One output padded as in the batch (veRL's): ``(1, length)`` tensors, the prompt left-padded to
    ``rollout.prompt_length`` and the response right-padded to ``rollout.response_length``; build it with
    :meth:`from_output`."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    attention_mask: torch.Tensor
    response_logprobs: torch.Tensor | None = None
    multi_modal_inputs: dict[str, torch.Tensor] | None = None

    @field_validator("prompt_ids", mode="before")
    @classmethod
    def _prompt_token_ids(cls, value: Any) -> Any:  # replaces the list form's validator: a tensor stays a tensor
        return value

    @model_validator(mode="after")
    def _check_lengths(self) -> _InternalAgentLoopOutput:
        response = tuple(self.response_ids.shape)
        for name in ("response_mask", "response_logprobs"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != response:
                raise ValueError(f"_InternalAgentLoopOutput: {name} has shape {tuple(value.shape)}, not {response}")
        return self

    @classmethod
    def from_output(
        cls, output: AgentLoopOutput, prompt_length: int, response_length: int, pad_id: int, agent_name: str = ""
    ) -> _InternalAgentLoopOutput:
        """``output`` padded (see :func:`pad_sample`; errors name ``agent_name``)."""
        tensors = rows_to_tensors([pad_sample(output, agent_name, prompt_length, response_length, pad_id)])
        return cls(
            prompt_ids=tensors["prompts"],
            response_ids=tensors["responses"],
            input_ids=tensors["input_ids"],
            position_ids=tensors["position_ids"],
            response_mask=tensors["response_mask"],
            attention_mask=tensors["attention_mask"],
            response_logprobs=tensors.get("rollout_log_probs"),
            routed_experts=output.routed_experts,
            multi_modal_data=output.multi_modal_data,
            reward_score=output.reward_score,
            num_turns=output.num_turns,
            metrics=output.metrics,
            extra_fields=dict(output.extra_fields),
            mm_processor_kwargs=output.mm_processor_kwargs,
        )


def _ordered_keys(dicts: Any) -> list[str]:
    keys: list[str] = []
    for d in dicts:
        keys.extend(k for k in d if k not in keys)
    return keys


def object_column(values: list[Any]) -> np.ndarray:
    """A 1-D numpy object array of ``values`` (lists and dicts stay whole)."""
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


_TOOL_COUNTS = ("num_tool_calls", "tool_errors", "tool_timeouts", "tool_calls_dropped")


def agent_loop_metrics(samples: Sequence[dict[str, float]], batch: DataProto) -> dict[str, float]:
    """veRL's ``agent_loop/{generate_sequences,tool_calls,num_preempted}/{min,max,mean}`` over the samples'
    metrics, ``agent_loop/slowest/*``: the sample with the most generate + tool time (its prompt and response
    lengths too), and the tool agent's counts summed over the batch: ``agent_loop/{num_tool_calls,tool_errors,
    tool_timeouts,tool_calls_dropped}``, as are the gateway's (``agent_loop/gateway_*``). ``samples`` holds one
    entry per sample; with multi-output sessions the batch has more rows, counted by
    ``agent_loop/trajectories_per_sample/{mean,max}`` (the slowest sample's lengths are its final output's)."""
    if not samples:
        return {}
    metrics: dict[str, float] = {}
    columns = {}
    for key in ("generate_sequences", "tool_calls", "num_preempted"):
        columns[key] = np.array([float(s.get(key, 0.0)) for s in samples])
        for stat in ("min", "max", "mean"):
            metrics[f"agent_loop/{key}/{stat}"] = float(getattr(columns[key], stat)())
    slowest = int(np.argmax(columns["generate_sequences"] + columns["tool_calls"]))
    for key, column in columns.items():
        metrics[f"agent_loop/slowest/{key}"] = float(column[slowest])
    gateway = sorted({key for s in samples for key in s if key.startswith("gateway_")})
    for key in (*_TOOL_COUNTS, *gateway):  # the tool agent's and the gateway's counters, summed over the batch
        if any(key in s for s in samples):
            metrics[f"agent_loop/{key}"] = float(sum(s.get(key, 0) for s in samples))
    prompt_length = batch.batch["prompts"].shape[1]
    finals = final_rows(batch)
    if len(finals) != len(samples):
        raise ValueError(f"{len(samples)} samples' metrics for a batch of {len(finals)} samples")
    if len(finals) != len(batch):
        per_sample = np.diff(np.append(-1, finals))
        metrics["agent_loop/trajectories_per_sample/mean"] = float(per_sample.mean())
        metrics["agent_loop/trajectories_per_sample/max"] = float(per_sample.max())
    mask = batch.batch["attention_mask"][int(finals[slowest])]
    metrics["agent_loop/slowest/prompt_length"] = float(mask[:prompt_length].sum())
    metrics["agent_loop/slowest/response_length"] = float(mask[prompt_length:].sum())
    return metrics
