"""``RayDAPOTrainer``: the PPO trainer as DAPO's recipe (Yu et al., 2025, arXiv:2503.14476) uses it.

Everything DAPO changes is already a setting of the trainer, so this class adds no training logic and does not
override ``fit()``: dynamic sampling is the trainer's default rollout filter (``algorithm.filter_groups``: the
``_create_rollout_filter`` hook returns it, and every mode's rollout source applies it; it also logs
``train/num_gen_batches``), the overlong punishment is the ``dapo`` reward manager's ``reward_model.overlong_buffer``,
Clip-Higher and the token-level loss are the actor's ``clip_ratio_low`` / ``clip_ratio_high`` / ``loss_agg_mode``.
Because it keeps the trainer's own ``fit()``, the recipe runs in every mode the trainer implements (``trainer.mode``).

It exists for veRL's import path: code written against veRL's recipe imports
``recipe.dapo.dapo_ray_trainer.RayDAPOTrainer`` (and subclasses it); it logs the DAPO settings in effect when it
starts. (A buffer enabled with a manager that does not apply it is refused by the config validation.)
"""

from __future__ import annotations

import logging
from typing import Any

from verl.trainer.ppo.ray_trainer import RayPPOTrainer

__all__ = ["RayDAPOTrainer", "dapo_summary"]

logger = logging.getLogger(__name__)


def dapo_summary(config: Any) -> str:
    """One line with the DAPO settings of ``config`` in effect (logged when the trainer starts)."""
    actor = config.actor_rollout_ref.actor
    filter_groups = config.algorithm.get("filter_groups") or {}
    overlong = config.reward_model.get("overlong_buffer") or {}
    if filter_groups.get("enable", False):
        limit = filter_groups.get("max_num_gen_batches", 0)
        sampling = (
            f"dynamic sampling on {filter_groups.get('metric')!r} ({config.data.gen_batch_size} prompts per "
            f"generation batch, {'no limit' if limit <= 0 else f'at most {limit} batches'} per step)"
        )
    else:
        sampling = "no dynamic sampling"
    if overlong.get("enable", False):
        shaping = f"overlong buffer of {overlong.get('len')} tokens (penalty {overlong.get('penalty_factor')})"
    else:
        shaping = "no overlong buffer"
    return (
        f"DAPO: {sampling}; {shaping}; clip [1 - {actor.clip_ratio_low}, 1 + {actor.clip_ratio_high}]; "
        f"loss_agg_mode {actor.loss_agg_mode}"
    )


class RayDAPOTrainer(RayPPOTrainer):
    """``RayPPOTrainer`` under DAPO's name (see the module docstring); takes the same arguments and keeps its
    ``fit()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        logger.info(dapo_summary(self.config))
