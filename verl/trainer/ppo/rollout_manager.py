"""The driver's handles on generation and weight sync, at veRL's names, over the actor-rollout worker group.

- ``trainer.async_rollout_manager`` is an :class:`~verl.experimental.agent_loop.AgentLoopManager` (or the class
  ``rollout.agent.agent_loop_manager_class`` names): the trainer's one generation path — training, ReMax's greedy
  baseline, validation, and recipes' ``actor_rollout_wg.generate_sequences(batch)`` (routed to it by
  :func:`create_rollout_manager`) all generate through the agent loops.
- :class:`CheckpointManager` is ``trainer.checkpoint_manager``: ``update_weights()`` pushes the actor's weights
  into the rollout engines (and returns the sync's metrics), ``sleep_replicas()`` frees the engines' memory.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from verl.utils.metric import reduce_metrics

__all__ = ["CheckpointManager", "create_rollout_manager"]

logger = logging.getLogger(__name__)


def create_rollout_manager(
    config: Any,
    worker_group: Any,
    *,
    tokenizer: Any,
    reward_fn: Any = None,
    val_reward_fn: Any = None,
    step: Callable[[], int],
) -> Any:
    """The trainer's ``async_rollout_manager`` over the actor-rollout worker group, and that group's
    ``generate_sequences`` routed to it (veRL's older call: ``n`` responses per prompt row).

    ``rollout.agent.agent_loop_manager_class`` (a dotted path) replaces our manager; a class that is not an
    ``AgentLoopManager`` subclass gets veRL's arguments only (``config, worker_group``).
    """
    from verl.experimental.agent_loop import AgentLoopManager

    cls: Any = AgentLoopManager
    dotted = config.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
    if dotted:
        module, _, name = str(dotted).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as e:
            raise ImportError(f"rollout.agent.agent_loop_manager_class={dotted!r} cannot be imported: {e}") from e
        logger.info("generation through the agent-loop manager %s", dotted)
    if isinstance(cls, type) and issubclass(cls, AgentLoopManager):
        manager = cls(
            config, worker_group, tokenizer=tokenizer, reward_fn=reward_fn, val_reward_fn=val_reward_fn, step=step
        )
    else:
        manager = cls(config, worker_group=worker_group)
    if hasattr(manager, "generate_sequences_per_prompt"):
        worker_group.generate_sequences = manager.generate_sequences_per_prompt
    return manager


class CheckpointManager:
    """Weight sync between the actor and the rollout engines of the hybrid engine (veRL's checkpoint manager)."""

    def __init__(self, worker_group: Any) -> None:
        self.worker_group = worker_group

    def update_weights(self) -> dict[str, float]:
        """Push the actor's current weights into every rollout engine; returns the sync's metrics (reduced)."""
        stats = self.worker_group.update_weights()
        return reduce_metrics({k: [s[k] for s in stats] for k in stats[0]}) if stats else {}

    def sleep_replicas(self) -> None:
        """Free the rollout engines' memory until the next generation or weight sync."""
        self.worker_group.sleep()
