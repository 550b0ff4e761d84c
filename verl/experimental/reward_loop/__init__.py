"""veRL 0.10's reward-loop package, at its import path: the reward-loop managers (``reward_manager``), the served
reward model (:class:`RewardModelManager`, the router) and ``migrate_legacy_reward_impl``. Scoring itself happens in
the agent-loop workers as samples finish (docs/rewards.md); veRL's ``RewardLoopWorker`` / ``RewardLoopManager``
processes have no counterpart here.

veRL 0.10's recipe mains call ``migrate_legacy_reward_impl(config)`` right after Hydra, to read the older
``reward_model.*`` / ``reward_manager.*`` / ``custom_reward_function.*`` keys into ``reward.*``. The trainer's
start-up does that here for every entry point (`verl.trainer.config.layout`); calling it again is harmless.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RewardModelManager", "migrate_legacy_reward_impl"]


def __getattr__(name: str) -> Any:
    if name == "RewardModelManager":  # imported on first use: it pulls in the workers
        from verl.experimental.reward_loop.reward_model import RewardModelManager

        return RewardModelManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def migrate_legacy_reward_impl(config: Any) -> Any:
    """Read veRL's older reward keys into ``reward.*`` (each named in a warning), in place; returns ``config``.

    The trainer config's rules live with it (`verl.trainer.config.layout.migrate_legacy_reward_impl`), imported
    when this is called."""
    from verl.trainer.config.layout import migrate_legacy_reward_impl as migrate

    return migrate(config)
