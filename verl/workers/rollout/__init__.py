"""Rollout engines: the contract (:class:`BaseRollout`), the registry, and the torch engine ``HFRollout``.

Engines are imported on first use (``get_rollout_class(name)`` or ``verl.workers.rollout.HFRollout``), so importing
this package imports neither transformers nor vLLM.
"""

from __future__ import annotations

from typing import Any

from verl.workers.rollout.base import (
    WAKE_UP_TAGS,
    BaseRollout,
    get_rollout_class,
    register_rollout,
    registered_rollouts,
)

__all__ = [
    "WAKE_UP_TAGS",
    "BaseRollout",
    "HFRollout",
    "get_rollout_class",
    "register_rollout",
    "registered_rollouts",
]


def __getattr__(name: str) -> Any:
    if name == "HFRollout":
        from verl.workers.rollout.hf_rollout import HFRollout

        return HFRollout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
