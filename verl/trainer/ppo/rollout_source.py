"""Rollout sources: where ``fit()`` gets each step's training batch — the one place a trainer mode differs.

``fit()`` runs the same named stages in every mode: ``batch = source.next_batch(step)``, then the update stages
(old_log_prob → ref → values → adv → update_critic → update_actor → update_weights), then ``source.on_weights``
with the new weight version, validation, checkpoint, metrics. A source decides when and with which weights the
batch is generated; it is chosen by ``trainer.mode`` from a registry (:func:`register_rollout_source`).

- ``sync`` (:class:`SyncRolloutSource`): generate now, with the current weights (lag 0), then put the rollout
  engines to sleep until the update's weight push wakes them.
- ``colocate_async`` (:class:`~verl.trainer.ppo.colocate_async.ColocateAsyncRolloutSource`): resident rollout
  servers beside the training workers generate the next ``async_training.max_lag`` batches while the trainer
  updates; ``before_weights`` waits for the batch in flight, so each batch comes from one weight version.
- ``separate_async`` (:class:`~verl.trainer.ppo.separate_async.SeparateAsyncRolloutSource`): rollout servers on a
  pool of their own generate all the time into a bounded sample queue; the trainer takes whole groups from it.

A source never reaches into the trainer: what it uses is declared in its :class:`Rollouter` (prompts → scored
groups), which the trainer builds: the :class:`PromptStream`, the generation stages (the trainer's ``_rollout``: gen
→ gen_max → reward), the rollout servers, the trainer state, and a *rollout filter* (the trainer's
``_create_rollout_filter`` hook) that may keep only part of each generated batch and ask for more: DAPO's dynamic
sampling is one (:func:`verl.trainer.ppo.dynamic_sampling.accumulate_groups`).
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from verl.protocol import DataProto
from verl.trainer.config.layout import trainer_mode
from verl.trainer.ppo.dynamic_sampling import StepState, accumulate_groups

if TYPE_CHECKING:
    from verl.trainer.ppo.trainer_state import TrainerState

__all__ = [
    "PromptStream",
    "RolloutFilter",
    "Rollouter",
    "RolloutSource",
    "SyncRolloutSource",
    "get_rollout_source_class",
    "refuse_own_rollout_filter",
    "register_rollout_source",
    "registered_rollout_sources",
]

logger = logging.getLogger(__name__)

# (a scored generation batch, the step being assembled) → the training batch once complete, else None (more needed)
RolloutFilter = Callable[[DataProto, StepState], "DataProto | None"]


class PromptStream:
    """The training prompts, batch after batch and epoch after epoch, from the position the trainer state holds
    (``state.epoch`` and the data loader's own state): ``next()`` returns a ``DataProto`` of ``data.gen_batch_size``
    prompts, or None after ``trainer.total_epochs`` passes. ``state.epoch`` moves on when a pass ends."""

    def __init__(self, dataloader: Any, state: TrainerState, total_epochs: int) -> None:
        self.dataloader, self.state, self.total_epochs = dataloader, state, int(total_epochs)
        self._batches: Any = None

    def next(self) -> DataProto | None:
        while self.state.epoch < self.total_epochs:
            if self._batches is None:
                self._batches = iter(self.dataloader)
            try:
                return DataProto.from_single_dict(next(self._batches))
            except StopIteration:
                self._batches = None
                self.state.epoch += 1
        return None


@dataclass(frozen=True)
class Rollouter:
    """Prompts → scored groups: everything a :class:`RolloutSource` uses, passed in by the trainer (a source never
    reaches into the trainer).

    Args:
        config: the trainer config (resolved).
        state: the trainer state (step, epoch, weight version), read and, for the data position, advanced.
        rollout: ``rollout(prompts, step, *, epoch=None, seed_step=None, first_prompt=None)`` generates
            ``rollout.n`` responses per prompt with the engines' current weights and scores them (the trainer's
            generation stages, timed into ``step``).
        prompts: returns the training prompts' :class:`PromptStream` (made when training starts).
        total_training_steps: the run's steps.
        rollout_filter: keeps part of each scored generation batch and asks for more (None: none).
        updates_actor: whether the step in progress updates the actor (and pushes its weights).
        sleep_replicas: frees the rollout engines' memory until the next push.
        servers: returns the rollout servers' worker group (made when the workers start).
        trainer_workers: returns the training workers' group (made when the workers start).
        rollout_manager: returns the agent-loop manager that routes the generation requests.
        stage: ``stage(name, timing)`` times a stage of the step under ``timing_s/<name>``.
        owner: who made it (the trainer's class name), for messages.
    """

    config: Any
    state: TrainerState
    rollout: Callable[..., DataProto]
    prompts: Callable[[], PromptStream]
    total_training_steps: int
    rollout_filter: RolloutFilter | None = None
    updates_actor: Callable[[], bool] = lambda: True
    sleep_replicas: Callable[[], None] = lambda: None
    servers: Callable[[], Any] = lambda: None
    trainer_workers: Callable[[], Any] = lambda: None
    rollout_manager: Callable[[], Any] = lambda: None
    stage: Callable[[str, dict], Any] = lambda name, timing: contextlib.nullcontext()
    owner: str = "the trainer"


class RolloutSource(abc.ABC):
    """A trainer mode's schedule of generation (see the module docstring).

    Args:
        rollouter: what the source uses: prompts, the generation stages, the servers, the trainer state.
    """

    def __init__(self, rollouter: Rollouter) -> None:
        self.rollouter = rollouter

    @abc.abstractmethod
    def next_batch(self, step: StepState) -> DataProto | None:
        """The scored training batch of ``step`` (``data.train_batch_size`` prompts × ``rollout.n``; the next of
        its :attr:`parts_per_step` parts), its generation stages timed and their metrics added into ``step``; None
        when the data ran out."""

    #: the parts a step's batch is handed out in, one :meth:`next_batch` call each, each trained as it arrives (PPO
    #: mini-batches: veRL 0.10's ``separate_async`` streaming); 1: the whole batch at once
    parts_per_step: int = 1
    #: a sample whose agent loop raises is kept as a failed sample and its group marked failed (the replay-buffer
    #: schedule's); else the failure stops the run
    keeps_failed_samples: bool = False
    #: the mode's rollout engines are servers of their own beside the training workers (resident, never asleep),
    #: not the hybrid engine inside them
    resident_servers: bool = False
    #: those servers are on a pool of their own (the top-level ``rollout.*`` pool), reached by a collective push
    separate_pool: bool = False
    #: the training workers hold an engine of their own too, lent to generation between steps (the hybrid switch)
    trainer_engines: bool = False

    def before_weights(self, step: StepState) -> None:
        """The trainer is about to push new weights to the rollout engines (``sync``: nothing to do; a source
        generating with the current ones finishes first)."""
        return None

    def wait_idle(self) -> None:
        """Return when no generation of the source is in flight (before the trainer generates itself: validation,
        so that the servers never mix its requests with a batch's; ``sync``: nothing is ever in flight)."""
        return None

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The trainer generates itself inside (validation), with its newest weights, never mixed with the source's
        generation (default: :meth:`wait_idle` first)."""
        self.wait_idle()
        yield

    def on_weights(self, version: int) -> None:
        """The trainer pushed weight version ``version`` to the rollout engines (``sync``: nothing to do)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        """What the source holds that a checkpoint must restore (a sample queue, batches in flight)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; a source that holds nothing refuses a non-empty state."""
        if state:
            raise ValueError(
                f"the checkpoint holds rollout-source state {sorted(state)} that trainer.v1.trainer_mode="
                f"{trainer_mode(self.rollouter.config)!r} cannot restore; resume it with the mode that wrote it"
            )

    def close(self) -> None:
        """Stop whatever the source runs in the background (``sync``: nothing)."""
        return None

    def data_ran_out(self, step: StepState) -> None:
        """The prompts ran out while ``step`` was being assembled: a step that had started filling (a rollout
        filter kept part of its batches) says that it is not trained."""
        if step.gen_batches:
            logger.warning(
                "the data ran out during step %d after %d generation batches (%d of %d prompts kept): the step was "
                "not trained",
                self.rollouter.state.global_steps,
                step.gen_batches,
                step.kept_prompts,
                self.rollouter.config.data.train_batch_size,
            )


_SOURCES: dict[str, type[RolloutSource]] = {}
FIXED_LAG = "fixed_lag"  # trainer.v1.sampler.schedule's default


def _key(mode: str, schedule: str) -> str:
    return mode if schedule == FIXED_LAG else f"{mode}+{schedule}"


def register_rollout_source(
    mode: str, schedule: str = FIXED_LAG
) -> Callable[[type[RolloutSource]], type[RolloutSource]]:
    """Class decorator: the :class:`RolloutSource` of ``trainer.mode=<mode>`` under ``trainer.v1.sampler.schedule=
    <schedule>``."""
    key = _key(mode, schedule)

    def decorator(cls: type[RolloutSource]) -> type[RolloutSource]:
        if not (isinstance(cls, type) and issubclass(cls, RolloutSource)):
            raise TypeError(f"register_rollout_source({key!r}) decorates RolloutSource subclasses, got {cls!r}")
        if _SOURCES.get(key, cls) is not cls:
            raise ValueError(f"{key!r} already has the rollout source {_SOURCES[key].__qualname__}")
        _SOURCES[key] = cls
        return cls

    return decorator


def registered_rollout_sources() -> list[str]:
    """The trainer modes that have a rollout source (``<mode>+<schedule>`` for a schedule other than the fixed
    lag)."""
    return sorted({*_SOURCES, *_BUILT_IN})


_BUILT_IN = {
    "sync+replay_buffer": "verl.trainer.ppo.replay_batches",
    "colocate_async": "verl.trainer.ppo.colocate_async",
    "colocate_async+replay_buffer": "verl.trainer.ppo.colocate_replay",
    "separate_async": "verl.trainer.ppo.separate_async",
    "separate_async+replay_buffer": "verl.trainer.ppo.separate_replay",
}  # imported on first use


def get_rollout_source_class(mode: str, schedule: str = FIXED_LAG) -> type[RolloutSource]:
    """The rollout source of ``trainer.mode=<mode>`` under ``trainer.v1.sampler.schedule=<schedule>``."""
    key = _key(mode, schedule)
    if key not in _SOURCES and key in _BUILT_IN:
        importlib.import_module(_BUILT_IN[key])
    if key not in _SOURCES:
        raise ValueError(
            f"trainer.mode={mode!r} with trainer.v1.sampler.schedule={schedule!r} has no rollout source; registered: "
            f"{registered_rollout_sources()}"
        )
    return _SOURCES[key]


def refuse_own_rollout_filter(rollouter: Rollouter, schedule: str) -> None:
    """A schedule whose replay buffer evicts DAPO's filtered groups itself cannot also apply a recipe's own rollout
    filter (``_create_rollout_filter``): refuse it by name rather than skip it."""
    own = rollouter.rollout_filter
    if own is not None and getattr(own, "func", None) is not accumulate_groups:
        raise ValueError(
            f"{rollouter.owner}._create_rollout_filter gives a rollout filter of its own, which "
            f"trainer.v1.sampler.schedule={schedule} does not apply (its buffer evicts DAPO's filtered groups "
            f"itself); use trainer.v1.sampler.schedule={FIXED_LAG}"
        )


@register_rollout_source("sync")
class SyncRolloutSource(RolloutSource):
    """``trainer.mode=sync``: each step's batch is generated when the step asks for it, with the weights of the
    latest update (lag 0). After generating, the rollout engines sleep (``rollout.free_cache_engine``) when the
    step updates the actor, whose weight push wakes them; in a critic-warmup step they stay awake."""

    def next_batch(self, step: StepState) -> DataProto | None:
        r = self.rollouter
        batch = self._assemble(step)
        if batch is None:
            self.data_ran_out(step)
        elif r.updates_actor():
            with r.stage("gen", step.timing):  # as veRL's: freeing the engines counts as generation
                r.sleep_replicas()
        return batch

    def _assemble(self, step: StepState) -> DataProto | None:
        """``fixed_lag``: generation batches of ``data.gen_batch_size`` prompts until the rollout filter (if any)
        has a full training batch."""
        r = self.rollouter
        while True:
            prompts = r.prompts().next()
            if prompts is None:
                return None
            step.metrics.setdefault("training/epoch", r.state.epoch)
            batch = r.rollout(prompts, step)
            if r.rollout_filter is None:
                return batch
            batch = r.rollout_filter(batch, step)
            if batch is not None:
                return batch
