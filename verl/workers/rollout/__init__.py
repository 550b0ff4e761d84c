"""Rollout engines: the contract (:class:`BaseRollout`), the registry, and the torch engine ``HFRollout``.

Everything is imported on first use (``get_rollout_class(name)``, ``verl.workers.rollout.HFRollout``), so importing
this package imports neither torch nor transformers nor vLLM (config validation reads
`verl.workers.rollout.registry` before anything heavy starts).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "WAKE_UP_TAGS": "verl.workers.rollout.base",
    "BaseRollout": "verl.workers.rollout.base",
    "get_rollout_class": "verl.workers.rollout.base",
    "register_rollout": "verl.workers.rollout.base",
    "registered_rollouts": "verl.workers.rollout.registry",
    "HFRollout": "verl.workers.rollout.hf_rollout",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
