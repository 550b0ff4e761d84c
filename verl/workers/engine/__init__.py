"""Training engines: a model sharded over the ranks of a worker group, with its optimizer, schedule and checkpoints.

``get_engine_class(strategy)`` maps ``actor.strategy`` / ``critic.strategy`` to an engine class; "fsdp" and "fsdp2"
both give :class:`FSDPEngine` (FSDP2, ``fully_shard``).
"""

from verl.workers.engine.fsdp_engine import FSDPEngine
from verl.workers.engine.registry import ENGINE_REGISTRY, get_engine_class, register_engine

__all__ = ["ENGINE_REGISTRY", "FSDPEngine", "get_engine_class", "register_engine"]
