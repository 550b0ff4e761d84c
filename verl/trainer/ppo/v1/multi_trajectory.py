"""Advantages of agent loops that emit several outputs per session (veRL 0.10's multi-output sessions).

A session (``{uid}_{session_id}``) may produce several trajectories, keyed ``{uid}_{session_id}_{index}``. For
GRPO, the group statistics use each session's final output only (the highest ``index``): the estimator runs on
those rows, and each session's scalar advantage is then given to every output of the session, on its own response
tokens (the returns equal the advantages, as GRPO's do). Other estimators see the whole batch unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import AdvantageEstimator
from verl.trainer.ppo.utils import compute_advantage

__all__ = ["compute_advantage_for_multi_trajectories"]


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
