"""The sync mode under veRL 0.10's replay-buffer schedule (``trainer.v1.sampler.schedule=replay_buffer``).

Each step dispatches ``data.train_batch_size`` prompts, generates and scores them (one generation batch), and
records every prompt group in a :class:`~verl.trainer.ppo.v1.replay_buffer.ReplayBuffer` (dispatched at this step,
its trajectories, finished). The step's batch is what the buffer's ``sample`` returns: with DAPO's dynamic sampling
(``algorithm.filter_groups``) the groups whose metric does not vary are evicted, each earning a refill credit of 2
prompts, spent in further generation batches of at most ``max_inflight_gen_batches × train_batch_size`` prompts;
once ``train_batch_size`` groups are kept the oldest are trained and the rest discarded. Without a filter nothing is
evicted and the step trains exactly its dispatched prompts: the same run as the ``fixed_lag`` schedule.

Prompts are taken one by one from the data loader's batches (:class:`PromptPool`); what a refill leaves of a loader
batch is kept for the next step and saved in checkpoints. ``filter_groups.max_num_gen_batches`` is not read here
(veRL 0.10 ignores it too): the in-flight bound and the data's end limit the refills. A buffer class of the
user's (``trainer.v1.sampler.custom_sampler.{path,name}``, a :class:`ReplayBuffer` subclass; ``sampler_kwargs``
reach its constructor) replaces the built-in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from verl.experimental.agent_loop.failures import FAILED_COLUMN
from verl.protocol import DataProto
from verl.trainer.ppo.dynamic_sampling import StepState, group_filter_values
from verl.trainer.ppo.rollout_source import (
    Rollouter,
    SyncRolloutSource,
    refuse_own_rollout_filter,
    register_rollout_source,
)
from verl.trainer.ppo.v1.multi_trajectory import has_multi_outputs
from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY, ReplayBuffer, ReplayBufferAsync
from verl.utils.tracking.tables import FILTERED_REWARD_TABLE_KEY

__all__ = [
    "DataRanOut",
    "PromptPool",
    "ReplayBufferBatches",
    "SyncReplaySource",
    "add_sample_metrics",
    "buffer_kwargs",
    "sampler_class",
]

logger = logging.getLogger(__name__)

TRAIN = "train"


class DataRanOut(Exception):
    """The prompts ran out while a step was being assembled."""


class PromptPool:
    """Prompts ``k`` at a time from a :class:`~verl.trainer.ppo.rollout_source.PromptStream` (``prompts()`` gives
    it: the trainer makes it in ``fit``; ``epoch()`` is the pass it is in); the rest of a loader batch waits for the
    next take, with the epoch it was drawn in."""

    def __init__(self, prompts: Callable[[], Any], epoch: Callable[[], int]) -> None:
        self.prompts, self.epoch = prompts, epoch
        self.leftover: DataProto | None = None
        self.leftover_epoch = 0

    def take(self, k: int) -> list[tuple[int, DataProto]] | None:
        """``k`` prompts as ``(epoch, prompts)`` parts (two where the take crosses an epoch's end: a prompt's group
        id holds its epoch), or None when the data ran out first (what was taken is put back)."""
        parts: list[tuple[int, DataProto]] = []
        have = 0
        while have < k:
            if self.leftover is None or len(self.leftover) == 0:
                self.leftover = self.prompts().next()
                if self.leftover is None:
                    self._put_back(parts)
                    return None
                self.leftover_epoch = self.epoch()
            part = self.leftover[: k - have]
            self.leftover = self.leftover[len(part) :]
            if parts and parts[-1][0] == self.leftover_epoch:
                parts[-1] = (self.leftover_epoch, DataProto.concat([parts[-1][1], part]))
            else:
                parts.append((self.leftover_epoch, part))
            have += len(part)
        return parts

    def _put_back(self, parts: list[tuple[int, DataProto]]) -> None:
        if parts:  # at the data's end: too few for the take, kept for a checkpoint's sake
            self.leftover_epoch = parts[0][0]
            self.leftover = DataProto.concat([part for _, part in parts])

    def state_dict(self) -> dict[str, Any]:
        leftover = self.leftover if self.leftover is not None and len(self.leftover) else None
        return {"leftover": leftover, "leftover_epoch": self.leftover_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.leftover, self.leftover_epoch = state.get("leftover"), int(state.get("leftover_epoch", 0))


def sampler_class(sampler: Any, is_async: bool = False) -> type[ReplayBuffer]:
    """The buffer class: ``trainer.v1.sampler.custom_sampler.{path,name}`` (a :class:`ReplayBuffer` subclass of
    the user's, taking the built-in's keyword arguments, ``sampler_kwargs`` among them), else the built-in
    (:class:`ReplayBufferAsync` for an async mode)."""
    custom = sampler.get("custom_sampler") or {}
    if not custom.get("path"):
        return ReplayBufferAsync if is_async else ReplayBuffer
    from verl.utils.import_utils import load_extern_type

    where = f"trainer.v1.sampler.custom_sampler (path={custom.get('path')!r}, name={custom.get('name')!r})"
    try:
        cls = load_extern_type(custom["path"], custom.get("name") or "")
    except (AttributeError, FileNotFoundError, RuntimeError, TypeError) as e:
        raise ValueError(f"{where}: {e}") from e
    if not issubclass(cls, ReplayBuffer):
        raise TypeError(
            f"{where}: {cls.__qualname__} is not a subclass of verl.trainer.ppo.v1.replay_buffer.ReplayBuffer, whose "
            "put_prompt / put_trajectory / set_status the sync schedule writes and whose sample(global_steps, "
            "partition_id, batch_size) it reads"
        )
    if cls.is_async != is_async:
        kind, mode = ("an async", "the sync mode") if cls.is_async else ("a sync", "an async mode")
        raise TypeError(f"{where}: {cls.__qualname__} is {kind} buffer (is_async={cls.is_async}); {mode} needs another")
    logger.info("replay buffer: %s from %s", cls.__qualname__, custom["path"])
    return cls


def add_sample_metrics(step: StepState, metrics: dict[str, Any], filtering: bool) -> None:
    """A sample's eviction metrics into ``step``: the filtered groups by value for wandb's table (the trainer logs
    it there, not among the scalars) and, with DAPO's filter on, its counts even when zero."""
    dropped = metrics.pop(DAPO_FILTERED_REWARD_COUNTS_KEY, None)
    if dropped:
        step.metrics[FILTERED_REWARD_TABLE_KEY] = dropped
    step.metrics.update(metrics)
    if filtering:
        for name in ("evicted_samples", "discarded_surplus_samples"):
            step.metrics.setdefault(f"training/filter_groups/{name}", 0)


def buffer_kwargs(config: Any, mode: str, refill_fn: Callable[[int], Any]) -> dict[str, Any]:
    """The keyword arguments every buffer class takes, from ``trainer.v1`` and ``algorithm.filter_groups``."""
    sampler, filter_cfg = config.trainer.v1.sampler, config.algorithm.get("filter_groups") or {}
    return {
        "trainer_mode": mode,
        "trainer_config": config.trainer.v1.get(mode),
        "max_off_policy_threshold": int(sampler.max_off_policy_threshold),
        "max_off_policy_strategy": str(sampler.max_off_policy_strategy),
        "sampler_kwargs": dict(sampler.get("sampler_kwargs") or {}),
        "refill_fn": refill_fn,
        "filter_groups_metric": filter_cfg.get("metric") if filter_cfg.get("enable", False) else None,
        "sync_refill_failed_groups": bool(sampler.get("sync_refill_failed_groups", False)),
        "poll_interval": 0.05,
    }


def record_groups(
    buffer: ReplayBuffer,
    batch: DataProto,
    ref: Callable[[int], Any],
    metric: str | None,
    keys: list[str] | None = None,
) -> None:
    """Record the scored ``batch``'s prompt groups in ``buffer``: each sample as a trajectory (``ref(row)``, with
    DAPO's ``metric`` value) under its prompt's key (``keys``, one per prompt in the batch's order; default: the
    uids), then the group's end: ``failure`` when one of its samples failed (``__failed__``: not a trajectory),
    else ``finished``."""
    if has_multi_outputs(batch):
        raise NotImplementedError(
            "agent loops returning several outputs per sample (multi-output sessions) do not run under "
            "trainer.v1.sampler.schedule=replay_buffer yet: use the fixed-lag schedule (the default)"
        )
    uids = batch.non_tensor_batch["uid"]
    failed = batch.non_tensor_batch.get(FAILED_COLUMN)
    values = group_filter_values(batch, metric) if metric else None
    rows: dict[Any, list[int]] = {}
    for row, uid in enumerate(uids):
        rows.setdefault(uid, []).append(row)
    for key, uid in zip(keys or list(rows), rows, strict=True):
        any_failed = False
        for row in rows[uid]:
            if failed is not None and failed[row]:
                any_failed = True
                continue
            buffer.put_trajectory(TRAIN, key, ref(row), {metric: float(values[row])} if metric else None)
        buffer.set_status(TRAIN, key, "failure" if any_failed else "finished")


def own_group_for_failed(batch: DataProto) -> DataProto:
    """Give each failed sample of ``batch`` a group id of its own (``<uid>/failed-<row>``), so that a group's
    advantage is computed over the samples that did not fail (veRL's padding samples have ids of their own too)."""
    failed = batch.non_tensor_batch.get(FAILED_COLUMN)
    if failed is not None and failed.any():
        uids = batch.non_tensor_batch["uid"].copy()
        for row in np.flatnonzero(failed):
            uids[row] = f"{uids[row]}/failed-{row}"
        batch.non_tensor_batch["uid"] = uids
    return batch


class ReplayBufferBatches:
    """Assembles each sync step's batch through the replay buffer (see the module docstring).

    Args:
        config: the trainer config (``data``, ``algorithm.filter_groups``, ``trainer.v1``).
        rollout: ``rollout(prompts, step, first_prompt, epoch)`` generates and scores prompts (the trainer's
            stages), the prompts numbered from ``first_prompt`` within the step (their sampling seeds), drawn in pass
            ``epoch`` over the data (their group ids).
        prompts: returns the trainer's prompt stream.
        epoch: returns the stream's pass over the data.
    """

    def __init__(
        self,
        config: Any,
        rollout: Callable[[DataProto, StepState, int, int], DataProto],
        prompts: Callable[[], Any],
        epoch: Callable[[], int],
    ) -> None:
        filter_cfg = config.algorithm.get("filter_groups") or {}
        kwargs = buffer_kwargs(config, "sync", self._dispatch)  # a refill generates at once: the sync mode waits
        self.metric = kwargs["filter_groups_metric"]
        self.train_batch_size = int(config.data.train_batch_size)
        self.rollout, self.pool, self.epoch = rollout, PromptPool(prompts, epoch), epoch
        self.buffer = sampler_class(config.trainer.v1.sampler)(
            **kwargs,
            train_batch_size=self.train_batch_size,
            max_inflight_gen_batches=int(filter_cfg.get("max_inflight_gen_batches", 1)),
        )
        self._step: StepState | None = None
        self._global_steps = 0
        self._batches: list[DataProto] = []
        self._rows: dict[Any, list[tuple[int, int]]] = {}  # each dispatched group's samples, failed ones included
        self._dispatched = 0

    def next_batch(self, step: StepState, global_steps: int) -> DataProto | None:
        """The step's training batch (``train_batch_size`` groups), or None when the data ran out."""
        self._step, self._global_steps, self._batches, self._dispatched = step, global_steps, [], 0
        self._rows = {}
        try:
            self._dispatch(self.train_batch_size)
            groups, metrics = self.buffer.sample(global_steps, TRAIN, self.train_batch_size)
        except DataRanOut:
            self.buffer.clear(TRAIN)
            return None
        add_sample_metrics(step, metrics, filtering=bool(self.metric))
        if self.metric:  # as the fixed-lag schedule's dynamic sampling logs it
            step.metrics["train/num_gen_batches"] = step.gen_batches
        merged = DataProto.concat(self._batches) if len(self._batches) > 1 else self._batches[0]
        offsets = np.cumsum([0] + [len(b) for b in self._batches])
        # every sample of a group, its failed ones padded in as failed samples (masked, score 0)
        rows = [int(offsets[b] + r) for group in groups for b, r in self._rows[group.uid]]
        self._batches, self._rows = [], {}
        return own_group_for_failed(merged.select_idxs(rows))

    def _dispatch(self, k: int) -> None:
        """Generate and score ``k`` new prompts (one generation batch; two at an epoch's end) and record their
        groups in the buffer, finished."""
        parts = self.pool.take(k)
        if parts is None:
            raise DataRanOut
        step = self._step
        step.metrics.setdefault("training/epoch", self.epoch())
        step.gen_batches += 1
        for epoch, prompts in parts:
            batch = self.rollout(prompts, step, self._dispatched, epoch)
            self._dispatched += len(prompts)
            self._record(batch)
        logger.info("replay buffer: generated %d prompts (%d this step)", k, self._dispatched)

    def _record(self, batch: DataProto) -> None:
        index = len(self._batches)
        self._batches.append(batch)
        for row, uid in enumerate(batch.non_tensor_batch["uid"]):
            if uid not in self._rows:
                self.buffer.put_prompt(TRAIN, uid, self._global_steps, status="running")
            self._rows.setdefault(uid, []).append((index, row))
        record_groups(self.buffer, batch, lambda row: (index, row), self.metric)

    def state_dict(self) -> dict[str, Any]:
        """The prompts taken from the loader and not dispatched yet (the buffer is empty between steps)."""
        return {"prompt_pool": self.pool.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pool.load_state_dict(state.get("prompt_pool") or {})


@register_rollout_source("sync", schedule="replay_buffer")
class SyncReplaySource(SyncRolloutSource):
    """``trainer.mode=sync`` with ``trainer.v1.sampler.schedule=replay_buffer``: the step's batch through the
    replay buffer (:class:`ReplayBufferBatches`); the engines sleep after it as under the fixed lag."""

    keeps_failed_samples = True

    def __init__(self, rollouter: Rollouter) -> None:
        super().__init__(rollouter)
        r = rollouter
        refuse_own_rollout_filter(r, "replay_buffer")
        self.buffered = ReplayBufferBatches(
            r.config,
            lambda prompts, step, first, epoch: r.rollout(prompts, step, epoch=epoch, first_prompt=first),
            r.prompts,
            lambda: r.state.epoch,
        )

    def _assemble(self, step: StepState) -> DataProto | None:
        return self.buffered.next_batch(step, self.rollouter.state.global_steps)

    def state_dict(self) -> dict[str, Any]:
        return self.buffered.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffered.load_state_dict(state)
