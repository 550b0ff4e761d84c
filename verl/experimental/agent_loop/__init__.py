"""The AgentLoop: agent loops (``single_turn_agent`` and users' own) driving the rollout servers sample by sample.

veRL's import paths: ``from verl.experimental.agent_loop import AgentLoopBase, AgentLoopOutput, register, ...``.
"""

from verl.experimental.agent_loop.agent_loop import (
    AgentLoopBase,
    AgentLoopMetrics,
    AgentLoopOutput,
    DictConfigWrap,
    register,
    registered_agent_loops,
)
from verl.experimental.agent_loop.manager import AgentLoopManager
from verl.experimental.agent_loop.server_manager import AsyncLLMServerManager
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.worker import AgentLoopWorker, AgentLoopWorkerBase

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
