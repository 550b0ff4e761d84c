"""veRL 0.10's trainer extension points: the hooks of ``PPOTrainer`` and the registry of trainer modes.

**Hooks.** :class:`TrainerHooks` holds veRL's hook names as no-ops; the trainer
(:class:`~verl.trainer.ppo.ray_trainer.RayPPOTrainer`, which is ``verl.trainer.ppo.v1.PPOTrainer``) calls them at
veRL's moments, so a subclass overrides only what it needs:

- ``on_init_end()``: after ``init_workers()`` built the workers (and loaded a checkpoint);
- ``on_train_begin()`` / ``on_train_end()``: around the training loop of ``fit()`` (``on_train_end`` also when it
  fails);
- ``on_validate_begin()`` / ``on_validate_end()``: around each validation that runs;
- per step: ``on_step_begin()``, ``prepare_step()`` (its dict joins the step's metrics), ``on_sample_begin()`` /
  ``on_sample_end()`` around taking the step's batch from the mode's rollout source, and ``on_step_end()`` after
  the update stages (the weight push is one of them, not this hook's job as in veRL).

**Modes.** ``trainer.v1.trainer_mode`` names a registered trainer class: ``sync``, ``colocate_async`` and
``separate_async`` are the trainer itself (each with its own rollout source); ``@register_trainer("name")`` adds a
subclass under a new name. Its class attribute ``rollout_mode`` names the built-in schedule it runs on (the
resource layout and rollout source of that mode). The module that registers a mode must be imported in the driver
before the config is validated and in the process that builds the trainer: ``actor_rollout_ref.model.external_lib``
does both (veRL has no key for it either).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

__all__ = [
    "BUILT_IN_MODES",
    "HOOKS",
    "TrainerHooks",
    "get_trainer_cls",
    "register_trainer",
    "registered_trainers",
    "rollout_mode_of",
]

logger = logging.getLogger(__name__)

BUILT_IN_MODES = ("sync", "colocate_async", "separate_async")
HOOKS = (
    "on_init_end",
    "on_train_begin",
    "on_train_end",
    "on_validate_begin",
    "on_validate_end",
    "on_step_begin",
    "prepare_step",
    "on_sample_begin",
    "on_sample_end",
    "on_step_end",
)

_TRAINERS: dict[str, type] = {}


class TrainerHooks:
    """veRL 0.10's ``PPOTrainer`` hooks, all no-ops here (see the module docstring for when each runs).

    ``rollout_mode``: the built-in schedule a registered subclass runs on (None: its registered name, which must
    then be a built-in mode)."""

    rollout_mode: str | None = None

    def on_init_end(self) -> None:
        """After the workers are built."""

    def on_train_begin(self) -> None:
        """Before the first step of ``fit()``."""

    def on_train_end(self) -> None:
        """After the last step of ``fit()`` (also when it raised)."""

    def on_validate_begin(self) -> None:
        """Before a validation."""

    def on_validate_end(self) -> None:
        """After a validation."""

    def on_step_begin(self) -> None:
        """At the start of a training step (``global_steps`` already counts it)."""

    def prepare_step(self) -> dict[str, Any]:
        """Before the step's batch is taken; the returned metrics join the step's."""
        return {}

    def on_sample_begin(self) -> None:
        """Before the step's batch is taken from the rollout source."""

    def on_sample_end(self) -> None:
        """After the step's batch is taken (generated and scored)."""

    def on_step_end(self) -> None:
        """After the step's update stages (weight push, validation and checkpoint included), before its metrics are
        logged."""


def register_trainer(name: str) -> Callable[[type], type]:
    """Register a trainer class (a subclass of ``PPOTrainer``) as ``trainer.v1.trainer_mode=name``; registering a
    name again with another class is an error."""

    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, TrainerHooks)):
            raise TypeError(f"register_trainer({name!r}): {cls!r} is not a PPOTrainer subclass")
        if name in BUILT_IN_MODES:
            raise ValueError(f"register_trainer({name!r}): {name!r} is a built-in trainer mode")
        held = _TRAINERS.get(name)
        if held is not None and held is not cls:
            raise ValueError(f"trainer mode {name!r} is already registered to {held.__module__}.{held.__qualname__}")
        schedule = cls.rollout_mode
        if schedule not in BUILT_IN_MODES:
            raise ValueError(
                f"register_trainer({name!r}): {cls.__qualname__}.rollout_mode={schedule!r}; set it to the built-in "
                f"schedule the mode runs on, one of {list(BUILT_IN_MODES)}"
            )
        _TRAINERS[name] = cls
        return cls

    return decorator


def registered_trainers() -> list[str]:
    """Every trainer mode name: the built-in ones, then the registered ones."""
    return [*BUILT_IN_MODES, *sorted(_TRAINERS)]


def get_trainer_cls(name: str) -> type:
    """The trainer class of mode ``name`` (the trainer itself for a built-in mode)."""
    if name in BUILT_IN_MODES:
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        return RayPPOTrainer
    if name not in _TRAINERS:
        raise ValueError(f"Unknown trainer mode {name!r}; registered: {registered_trainers()}")
    return _TRAINERS[name]


def rollout_mode_of(name: str) -> str:
    """The built-in schedule mode ``name`` runs on (``name`` itself for a built-in or an unknown name)."""
    cls = _TRAINERS.get(name)
    return cls.rollout_mode if cls is not None else name


def __getattr__(name: str) -> Any:
    # veRL's import path of the trainer class (``from verl.trainer.ppo.v1.trainer_base import PPOTrainer``); loaded on
    # use, as the trainer's module imports this one
    if name == "PPOTrainer":
        from verl.trainer.ppo.ray_trainer import RayPPOTrainer

        return RayPPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
