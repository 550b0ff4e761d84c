"""``separate_async`` under veRL 0.10's replay-buffer schedule (``trainer.v1.sampler.schedule=replay_buffer``):
rollout servers on a pool of their own fill a replay buffer; the trainer streams its step one PPO mini-batch at a
time.

- **Dispatch** as :mod:`verl.trainer.ppo.colocate_replay`: ``trainer.v1.separate_async.num_warmup_batches`` (W,
  also ``async_training.max_lag``) batches of ``data.train_batch_size`` prompts before step 1, one more at each step,
  refills one for one for the groups the :class:`~verl.trainer.ppo.v1.replay_buffer.ReplayBufferAsync` evicts (too
  stale under ``max_off_policy_strategy=drop``, DAPO-filtered). One generation thread of the driver generates the
  dispatches in order on the rollout servers.
- **Weights.** A push is staged in the servers while they generate (:mod:`verl.workers.remote_rollout`); the trainer
  never waits for generation before pushing. Each dispatch records the weight version current when it was made and
  its generation first has the servers load that version, so every group comes from one version and which version
  generates which group does not depend on timing (a resumed run trains what the uninterrupted one trains).
- **Streaming.** A step trains ``parameter_sync_step`` mini-batches (``data.train_batch_size /
  actor.ppo_mini_batch_size``, checked at start-up): each is sampled from the buffer when it is needed and trained at
  once (old-log-prob → … → update), every old-log-prob pass on the step's π_old
  (:class:`~verl.trainer.ppo.step_policy.StepPolicy`), then one push. Groups that finish while a mini-batch trains
  are in the buffer for the next one.
- **Validation** waits for the generations in flight and has the servers load the trainer's newest version.
- **Checkpoints** are written after the push, once the generations in flight are done: the buffer's finished groups
  (with their batches), the dispatch counters and the prompts left of a loader batch (the colocate source's state).

Partial rollout (``async_training.partial_rollout``) is not built for this schedule and is refused.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.config.derived import async_training_config
from verl.trainer.ppo.colocate_async import Generation
from verl.trainer.ppo.colocate_replay import ColocateReplaySource
from verl.trainer.ppo.dynamic_sampling import StepState
from verl.trainer.ppo.hybrid_switch import HybridSwitch, SwitchSettings
from verl.trainer.ppo.replay_batches import TRAIN
from verl.trainer.ppo.rollout_source import register_rollout_source
from verl.trainer.ppo.separate_async import StagedWeights

if TYPE_CHECKING:
    from verl.trainer.ppo.rollout_source import Rollouter

__all__ = ["SeparateReplaySource"]


@register_rollout_source("separate_async", schedule="replay_buffer")
class SeparateReplaySource(ColocateReplaySource):
    """``trainer.mode=separate_async`` with ``trainer.v1.sampler.schedule=replay_buffer`` (see the module
    docstring)."""

    separate_pool = True

    def __init__(self, rollouter: Rollouter) -> None:
        super().__init__(rollouter)
        r = rollouter
        config = r.config
        if async_training_config(config).partial_rollout:
            raise ValueError(
                "async_training.partial_rollout=true with trainer.v1.sampler.schedule=replay_buffer in "
                "separate_async: partial rollout is built for the fixed_lag schedule only"
            )
        mini = int(config.actor_rollout_ref.actor.ppo_mini_batch_size)
        self.parts_per_step = max(1, self.train_batch_size // mini)
        self.part_size = self.train_batch_size // self.parts_per_step
        self._parts_given = 0
        self._weights = StagedWeights(r.servers)  # what the servers' engines generate with
        hybrid = OmegaConf.select(config, "trainer.v1.separate_async.hybrid_rollout", default=None) or {}
        self.trainer_engines = bool(hybrid.get("enable_switch", False))
        self._switch_settings = SwitchSettings.from_config(hybrid) if self.trainer_engines else None
        self._switch: HybridSwitch | None = None  # made once the workers run
        self._lend_next = False

    def next_batch(self, step: StepState) -> DataProto | None:
        """The step's next mini-batch: the step's dispatch with the first one (and, with the hybrid switch, the
        training workers' engines taken back once enough groups are sampleable), then ``part_size`` groups
        sampled."""
        switch = self._hybrid_switch()
        if self._parts_given == 0:
            self._begin_step(step)
            if switch is not None:
                step.metrics.update(switch.reclaim_if_lent(self.buffer, self.rollouter.state.global_steps, step.timing))
        if switch is None:
            batch = self._sample(step, self.part_size)
        else:  # the switch learns how long missing groups take to come
            start = time.perf_counter()
            missing = self.part_size - self.buffer.get_sampleable_count(self.rollouter.state.global_steps, TRAIN)
            batch = self._sample(step, self.part_size)
            switch.note_sample(missing, time.perf_counter() - start)
        self._parts_given = 0 if batch is None else (self._parts_given + 1) % self.parts_per_step
        return batch

    def _hybrid_switch(self) -> HybridSwitch | None:
        """The hybrid switch (``hybrid_rollout.enable_switch``), made at first use: the workers run by then."""
        if self._switch_settings is None or self._switch is not None:
            return self._switch
        r = self.rollouter
        trainer_workers, manager = r.trainer_workers(), r.rollout_manager()
        servers = r.servers().world_size
        self._switch = HybridSwitch(
            self._switch_settings,
            self.train_batch_size,
            self.parts_per_step,
            scaling=(trainer_workers.world_size + servers) / servers,
            actor_wg=trainer_workers,
            manager=manager,
            handles=manager.replica_handles(trainer_workers),
            poll_interval=self.buffer.poll_interval,
        )
        trainer_workers.sleep()  # their engines hold no memory until lent
        return self._switch

    def _generate(self, generation: Generation, prompts: DataProto) -> DataProto:
        """On the generation thread: the servers load the dispatch's version, then generate and score."""
        self._weights.load(generation.weight_version)
        return super()._generate(generation, prompts)

    def before_weights(self, step: StepState) -> None:
        """The push is staged beside the servers' generation: nothing waits. Adds veRL's fully-async idle shares over
        the step: ``trainer/idle_ratio`` (the trainer waiting for groups) and ``rollouter/idle_ratio``."""
        self._add_idle_shares(step)
        if self._switch is not None:  # lend the training workers' engines for the next step?
            r = self.rollouter
            self._lend_next, metrics = self._switch.decide(self.buffer, r.state.global_steps, r.total_training_steps)
            step.metrics.update(metrics)

    def on_weights(self, version: int) -> None:
        """The push is staged; with the hybrid switch, the training workers' engines are lent now if so decided."""
        super().on_weights(version)
        if self._switch is not None and self._lend_next:
            self._lend_next = False
            self._switch.lend(version, self._step.timing if self._step is not None else {})

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Validation: the generations in flight end, then the servers load the trainer's newest version."""
        self.wait_idle()
        self._weights.load(self.rollouter.state.weight_version, drop_older=False)
        yield
