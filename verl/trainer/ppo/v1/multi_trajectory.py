"""Advantages of agent loops that emit several outputs per session (veRL 0.10's multi-output sessions).

A session (``{uid}_{session_id}``) may produce several trajectories, keyed ``{uid}_{session_id}_{index}``. For
GRPO, the group statistics use each session's final output only (the highest ``index``): the estimator runs on
those rows, and each session's scalar advantage is then given to every output of the session, on its own response
tokens (the returns equal the advantages, as GRPO's do). Other estimators see the whole batch unchanged.

In our batches a sample's outputs are numbered by ``__trajectory_index__`` (consecutive rows as the agent loops
return them: :mod:`verl.experimental.agent_loop.postprocess`); the trainer's join gives every row its sample's
``session_id`` (its place among its prompt's ``n`` samples, veRL's name), so ``(uid, session_id)`` names a session
wherever a reordering (the ranks' balance) puts its rows. The helpers here give the rows' keys
(:func:`trajectory_keys`), the sessions' final rows (:func:`final_rows`), join outputs to their prompts
(:func:`expand_to_outputs`), cut a fresh rollout into prompt groups (:func:`split_by_prompt`), give a session's final
reward to its other outputs (:func:`share_final_reward`) and pad a batch to a row count the data-parallel ranks
divide (:func:`pad_rows`: rows that train nothing, as veRL's padding samples).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from verl.experimental.agent_loop.postprocess import (
    SESSION_ID,
    TRAJECTORY_INDEX,
    final_rows,
    session_numbers,
    sessions,
    trajectory_indices,
)
from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.utils import compute_advantage

__all__ = [
    "PADDING_COLUMN",
    "SESSION_ID",
    "compute_advantage_for_multi_trajectories",
    "expand_to_outputs",
    "final_rows",
    "has_multi_outputs",
    "pad_rows",
    "share_final_reward",
    "split_by_prompt",
    "trajectory_keys",
]

# the column that flags the rows :func:`pad_rows` added
PADDING_COLUMN = "__padding__"


def has_multi_outputs(batch: DataProto) -> bool:
    """Whether some sample of ``batch`` has more than one output row."""
    return bool((trajectory_indices(batch) > 0).any())


def _session_ids(batch: DataProto) -> np.ndarray:
    """Per row, its ``session_id`` where the batch has it, else its session's number among consecutive rows."""
    ids = batch.non_tensor_batch.get(SESSION_ID)
    return session_numbers(batch) if ids is None else np.asarray(ids, dtype=np.int64)


def trajectory_keys(batch: DataProto) -> list[str]:
    """veRL 0.10's ``{uid}_{session_id}_{index}`` of each row."""
    uids, ids, index = batch.non_tensor_batch["uid"], _session_ids(batch), trajectory_indices(batch)
    return [f"{u}_{s}_{i}" for u, s, i in zip(uids, ids, index, strict=True)]


def expand_to_outputs(repeated: DataProto, outputs: DataProto) -> DataProto:
    """``repeated`` (one row per sample) with each row repeated once per output of its sample in ``outputs``, so
    that the two join row by row; unchanged when every sample has one output."""
    if len(outputs) == len(repeated):
        return repeated
    sessions = session_numbers(outputs)
    count = int(sessions[-1]) + 1 if len(sessions) else 0
    if count != len(repeated):
        raise ValueError(f"the rollout returned outputs of {count} samples for {len(repeated)} prompts' samples")
    return repeated.select_idxs(torch.as_tensor(sessions))


def split_by_prompt(batch: DataProto, prompts: int) -> list[DataProto]:
    """``batch`` cut into ``prompts`` consecutive groups of equally many samples (each prompt's ``n`` samples and
    all their outputs)."""
    sessions = session_numbers(batch)
    count = int(sessions[-1]) + 1 if len(sessions) else 0
    if prompts <= 0 or count % prompts:
        raise ValueError(f"{count} samples do not split into {prompts} prompt groups")
    group = sessions // (count // prompts)
    bounds = np.searchsorted(group, np.arange(prompts + 1))
    return [batch.slice(int(bounds[i]), int(bounds[i + 1])) for i in range(prompts)]


def share_final_reward(batch: DataProto, reward: torch.Tensor) -> torch.Tensor:
    """``reward`` (rows × response length) with each session's final-output reward given to its other outputs, at
    their last response token (veRL 0.10: a session is scored on its final output)."""
    finals, of_row = torch.as_tensor(final_rows(batch)), sessions(batch)
    is_final = torch.zeros(len(batch), dtype=torch.bool)
    is_final[finals] = True
    total_of = {int(of_row[row]): float(total) for row, total in zip(finals.tolist(), reward.sum(-1)[finals])}
    totals = torch.tensor([total_of[int(s)] for s in of_row], dtype=reward.dtype)
    valid = batch.batch["attention_mask"][:, -reward.shape[-1] :].sum(-1)
    shared = torch.zeros_like(reward)
    shared[torch.arange(len(batch)), (valid - 1).clamp(min=0)] = totals
    return torch.where(is_final.unsqueeze(-1), reward, shared)


def pad_rows(batch: DataProto, multiple: int) -> DataProto:
    """``batch`` with rows appended until ``multiple`` divides its length: copies of its first row that train
    nothing (no response token in the mask, zero scores, each its own prompt and sample), flagged in
    :data:`PADDING_COLUMN` (veRL 0.10 pads a multi-output batch the same way)."""
    missing = -len(batch) % multiple
    if not missing:
        return batch
    pad = batch.select_idxs([0] * missing)
    for key in ("response_mask", "rm_scores", "token_level_scores", "token_level_rewards"):
        if key in pad.batch.keys():
            pad.batch[key] = torch.zeros_like(pad.batch[key])
    pad.non_tensor_batch["uid"] = np.array([f"pad-{i}" for i in range(missing)], dtype=object)
    for key in (TRAJECTORY_INDEX, SESSION_ID):
        if key in pad.non_tensor_batch:
            pad.non_tensor_batch[key] = np.zeros(missing, dtype=np.int64)
    batch.non_tensor_batch[PADDING_COLUMN] = np.zeros(len(batch), dtype=bool)
    pad.non_tensor_batch[PADDING_COLUMN] = np.ones(missing, dtype=bool)
    return DataProto.concat([batch, pad])


def _session_of(key: str) -> tuple[str, int]:
    """``("{uid}_{session_id}", index)`` of a trajectory key ``{uid}_{session_id}_{index}``."""
    parts = key.rsplit("_", 2)
    if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
        raise ValueError(f"trajectory key {key!r} is not of the form '{{uid}}_{{session_id}}_{{index}}'")
    return f"{parts[0]}_{parts[1]}", int(parts[2])


def compute_advantage_for_multi_trajectories(
    data: DataProto,
    batch_keys: Sequence[str],
    adv_estimator: Any,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> DataProto:
    """``data`` with ``advantages`` and ``returns``; ``batch_keys[i]`` is row i's trajectory key. GRPO: computed on
    each session's final output and broadcast over the session (module docstring); any other estimator:
    :func:`verl.trainer.ppo.utils.compute_advantage` on the whole batch."""
    kwargs = {
        "adv_estimator": adv_estimator,
        "gamma": gamma,
        "lam": lam,
        "num_repeat": num_repeat,
        "norm_adv_by_std_in_grpo": norm_adv_by_std_in_grpo,
        "config": config,
    }
    if adv_estimator != AdvantageEstimator.GRPO:
        return compute_advantage(data, **kwargs)
    if len(batch_keys) != len(data):
        raise ValueError(f"{len(batch_keys)} trajectory keys for a batch of {len(data)} rows")
    sessions = [_session_of(key) for key in batch_keys]
    final_row: dict[str, tuple[int, int]] = {}  # session -> (index, row) of its final output
    for row, (session, index) in enumerate(sessions):
        if session not in final_row or final_row[session][0] < index:
            final_row[session] = (index, row)
    order = list(final_row)  # sessions in order of first appearance
    finals = compute_advantage(data.select_idxs([final_row[s][1] for s in order]), **kwargs)
    mask = finals.batch["response_mask"]
    first_token = mask.float().argmax(dim=1)  # a GRPO advantage is one value over the row's response tokens
    per_session = finals.batch["advantages"][torch.arange(len(finals)), first_token]
    position = {session: i for i, session in enumerate(order)}
    scores = per_session[[position[session] for session, _ in sessions]]
    advantages = scores.unsqueeze(-1) * data.batch["response_mask"]
    data.batch["advantages"] = advantages
    data.batch["returns"] = advantages.clone()
    return data
