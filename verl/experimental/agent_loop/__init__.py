"""The AgentLoop: agent loops (``single_turn_agent`` and users' own) driving the rollout servers sample by sample.

veRL's import paths: ``from verl.experimental.agent_loop import AgentLoopBase, AgentLoopOutput, register, ...``.
"""

import importlib
from typing import Any

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    register,
    registered_agent_loops,
)

# imported on first use: they load torch, which the driver process (it only validates the config) never needs
_LAZY = {
    "AgentLoopManager": "manager",
    "AsyncLLMServerManager": "server_manager",
    "SingleTurnAgentLoop": "single_turn_agent_loop",
    "AgentLoopWorker": "worker",
    "AgentLoopWorkerBase": "worker",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AgentLoopBase",
    "AgentLoopManager",
    "AgentLoopMetrics",
    "AgentLoopOutput",
    "AgentLoopWorker",
    "AgentLoopWorkerBase",
    "AsyncLLMServerManager",
    "DictConfigWrap",
    "SingleTurnAgentLoop",
    "register",
    "registered_agent_loops",
]
