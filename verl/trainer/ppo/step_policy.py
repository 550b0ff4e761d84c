"""π_old for a step trained one PPO mini-batch at a time (veRL 0.10's ``separate_async`` streaming).

A rollout source that streams (``RolloutSource.parts_per_step`` > 1) hands the trainer its step's batch one
mini-batch at a time; each is trained as it arrives, so the later mini-batches' old-log-prob passes would run weights
the earlier updates have changed. :class:`StepPolicy` keeps every pass on the weights the step started from, the
way veRL does, through the training workers' ``save_model_to_cpu`` / ``restore_model_from_cpu`` /
``clear_cpu_model`` (:mod:`verl.workers.engine.snapshots`): before the first pass the weights are kept as copy 0;
around each later pass the current weights are kept as copy k, copy 0 is restored, and copy k is restored after.
Nothing is copied for a step of one part, in bypass mode (the rollout's log-probs are the old ones) or in a step
that does not update the actor (critic warm-up).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["StepPolicy"]

STEP_START = 0  # the copy that holds π_old


class StepPolicy:
    """The step's π_old around the old-log-prob passes of its parts (see the module docstring).

    Args:
        actor_wg: the training workers (``save_model_to_cpu`` / ``restore_model_from_cpu`` / ``clear_cpu_model``).
        parts: how many parts the step trains in.
        active: whether the parts' updates change the weights the passes run (false: bypass mode, no actor update).
    """

    def __init__(self, actor_wg: Any, parts: int, active: bool) -> None:
        self.actor_wg = actor_wg
        self.active = active and parts > 1
        self._saved = False  # π_old's copy exists

    @contextlib.contextmanager
    def old_log_prob_pass(self, part: int) -> Iterator[None]:
        """Inside, the actor holds the step's π_old for part ``part``'s old-log-prob pass."""
        if not self.active:
            yield
            return
        if part == STEP_START:
            self.actor_wg.save_model_to_cpu(STEP_START)
            self._saved = True
            yield
            return
        wg = self.actor_wg
        wg.save_model_to_cpu(part)
        wg.restore_model_from_cpu(STEP_START)
        try:
            yield
        finally:
            wg.restore_model_from_cpu(part)
            wg.clear_cpu_model(part)

    def end(self) -> None:
        """The step's parts are trained: drop π_old's copy."""
        if self._saved:
            self.actor_wg.clear_cpu_model(STEP_START)
            self._saved = False
