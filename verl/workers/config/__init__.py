"""Config schemas of the worker roles."""

from verl.workers.config.actor import ActorConfig, PolicyLossConfig

__all__ = ["ActorConfig", "PolicyLossConfig"]
