"""veRL 0.10's home of the V0 task runner: ``from verl.trainer.main_ppo_v0 import TaskRunner, BaseTaskRunner``.

veRL 0.10 split its runner in two: ``BaseTaskRunner`` (the ``add_*_worker`` / resource-pool hooks a recipe
overrides) and ``TaskRunner`` (those plus ``run``). Here one runner, :class:`verl.trainer.main_ppo.TaskRunner`,
serves both layouts and both of veRL's trainer generations (``trainer.use_v1`` selects nothing here: the mode is
``trainer.v1.trainer_mode``), so both names are that class; pass it, or a subclass, to
:func:`verl.trainer.main_ppo.run_ppo`.
"""

from __future__ import annotations

from verl.trainer.main_ppo import TaskRunner, run_ppo

BaseTaskRunner = TaskRunner

__all__ = ["BaseTaskRunner", "TaskRunner", "run_ppo"]
