"""A binary reward for the built-in arithmetic task: 1 when the response is exactly the right number, else 0.

The usual GRPO reward (exact match, as on GSM8K or MATH): a group whose samples are all wrong (or all right) has
equal rewards, hence zero advantages, which is what ``actor.skip_zero_advantage_samples`` skips. Standalone (loaded
by path in TRL's venv too): ``compute_score(text, truth)`` for TRL, ``verl_reward`` with veRL's signature for us.
"""

from __future__ import annotations

import re

_INTEGER = re.compile(r"[-+]?\d+")


def compute_score(solution_str: str, ground_truth, extra_info: dict | None = None) -> dict:
    """``{"score": 1.0 or 0.0}``: the stripped response is the ground-truth integer."""
    text = solution_str.strip()
    right = bool(_INTEGER.fullmatch(text)) and len(text) <= 18 and int(text) == int(str(ground_truth).strip())
    return {"score": float(right), "acc": float(right)}


def verl_reward(data_source: str, solution_str: str, ground_truth, extra_info: dict | None = None) -> dict:
    """veRL's custom reward signature (``custom_reward_function.name=verl_reward``)."""
    return compute_score(solution_str, ground_truth, extra_info)
