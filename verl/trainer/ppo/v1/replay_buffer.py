"""veRL 0.10's replay buffer semantics (``trainer.v1.sampler.*``) over an in-memory store of prompt groups.

A producer (the rollouter) records each dispatched prompt (:meth:`ReplayBuffer.put_prompt`, with the global step it
was dispatched at), its trajectories as they finish (:meth:`~ReplayBuffer.put_trajectory`) and its end
(:meth:`~ReplayBuffer.set_status`: ``finished`` or ``failure``). The trainer calls :meth:`~ReplayBuffer.sample`,
which blocks until ``batch_size`` groups are *sampleable* and returns the oldest ones (by dispatch step, then
dispatch order) with their trajectories, removed from the store. Before each look it evicts terminal groups:

- **stale** (async buffer, strategy ``drop``): age ``global_steps − dispatch_step + 1 > max_off_policy_threshold``;
  with ``wait`` nothing stale is dropped, but sampling blocks while a pending or running group has age ≥ threshold;
- **DAPO-filtered** (``filter_groups_metric`` set): a finished group of more than one trajectory whose metric
  (``reward_extra_info[metric]`` of each trajectory) does not vary; a finished group without it is an error;
- **failed** (async buffer): status ``failure``; the sync buffer keeps a failed group sampleable (its missing
  trajectories are padded later) unless ``sync_refill_failed_groups`` and it has none.

A group evicted for several reasons counts once. The async buffer refills exactly k prompts for k evicted groups
(``refill_fn(k)``). The sync buffer earns refill credit instead — 2 per DAPO-filtered group, 1 per failed group —
and spends it in dispatches of at most the free room under ``max_inflight_gen_batches × train_batch_size`` prompts
in flight; once enough groups are sampleable it stops dispatching, waits for the prompts still in flight, returns
the oldest ``batch_size`` and discards the rest (``…/filter_groups/discarded_surplus_samples``). The ``val``
partition never evicts. Metrics are named under ``training/`` for the ``train`` partition and ``validation/``
otherwise, as veRL's: ``…/off_policy/evicted_samples`` with ``…/evicted_samples_staleness/{mean,max,min}``,
``…/filter_groups/evicted_samples``, ``…/rollout_failure/evicted_samples``, and the filtered groups per metric value
(:data:`DAPO_FILTERED_REWARD_COUNTS_KEY`, a dict for wandb's table).

Every trainer mode takes its batches through it under ``trainer.v1.sampler.schedule=replay_buffer``
(:mod:`verl.trainer.ppo.replay_batches`, :mod:`verl.trainer.ppo.colocate_replay`,
:mod:`verl.trainer.ppo.separate_replay`), where a sample whose agent loop fails marks its group ``failure``
(:mod:`verl.experimental.agent_loop.failures`). The async buffer is tested here with real producer and consumer
threads.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from verl.trainer.ppo.v1.metrics import DAPO_FILTERED_REWARD_COUNTS_KEY

__all__ = [
    "DAPO_FILTERED_REWARD_COUNTS_KEY",
    "PromptGroup",
    "ReplayBuffer",
    "ReplayBufferAsync",
    "ReplayBufferClosed",
]

logger = logging.getLogger(__name__)

STATUSES = ("pending", "running", "finished", "failure")
TERMINAL = ("finished", "failure")
STRATEGIES = ("drop", "wait")


class ReplayBufferClosed(RuntimeError):
    """The buffer was closed while a caller waited on it."""


@dataclass
class PromptGroup:
    """One dispatched prompt: its status, dispatch step, dispatch order and the trajectories written so far (each
    with its ``reward_extra_info``)."""

    uid: str
    global_steps: int
    order: int
    status: str = "pending"
    trajectories: list[Any] = field(default_factory=list)
    reward_extra_info: list[dict[str, Any]] = field(default_factory=list)

    def age(self, global_steps: int) -> int:
        """Model versions between its dispatch and ``global_steps``, both counted."""
        return global_steps - self.global_steps + 1


class ReplayBuffer:
    """The sync trainer's buffer (see the module docstring); :class:`ReplayBufferAsync` is the async modes'.

    Args:
        trainer_mode / trainer_config: the mode and its ``trainer.v1.<mode>`` section (kept for custom samplers).
        max_off_policy_threshold: the largest age trained, in model versions (> 0).
        max_off_policy_strategy: ``drop`` or ``wait`` (async buffer only).
        sampler_kwargs: ``trainer.v1.sampler.sampler_kwargs`` (kept for custom samplers).
        refill_fn: ``refill_fn(k)`` dispatches k new prompts (each reaching :meth:`put_prompt`); needed for DAPO and
            for ``sync_refill_failed_groups``.
        filter_groups_metric: DAPO's metric (``algorithm.filter_groups.metric`` when enabled), else None.
        train_batch_size / gen_batch_size / max_inflight_gen_batches: the sync buffer's bound on prompts in flight
            while it refills (``max_inflight_gen_batches × train_batch_size``).
        sync_refill_failed_groups: replace failed groups that have no trajectory (sync; ``gen_batch_size`` must be 1).
        poll_interval: the longest wait between two looks when nothing wakes the buffer.
    """

    is_async = False

    def __init__(
        self,
        *,
        trainer_mode: str = "sync",
        trainer_config: Any = None,
        max_off_policy_threshold: int = 8,
        max_off_policy_strategy: str = "drop",
        sampler_kwargs: dict[str, Any] | None = None,
        refill_fn: Callable[[int], Any] | None = None,
        filter_groups_metric: str | None = None,
        train_batch_size: int = 1,
        gen_batch_size: int = 1,
        max_inflight_gen_batches: int = 1,
        sync_refill_failed_groups: bool = False,
        poll_interval: float = 2.0,
    ) -> None:
        where = "trainer.v1.sampler"
        if not isinstance(max_off_policy_threshold, int) or max_off_policy_threshold <= 0:
            raise ValueError(f"{where}.max_off_policy_threshold={max_off_policy_threshold!r}: a positive integer")
        if max_off_policy_strategy not in STRATEGIES:
            raise ValueError(f"{where}.max_off_policy_strategy={max_off_policy_strategy!r}; use one of {STRATEGIES}")
        if filter_groups_metric and refill_fn is None:
            raise ValueError("algorithm.filter_groups needs a refill_fn: the buffer replaces the groups it filters")
        if sync_refill_failed_groups and not self.is_async:
            if refill_fn is None:
                raise ValueError(f"{where}.sync_refill_failed_groups needs a refill_fn")
            if gen_batch_size != 1:
                raise ValueError(f"{where}.sync_refill_failed_groups needs data.gen_batch_size=1, not {gen_batch_size}")
        if filter_groups_metric and not self.is_async and max_inflight_gen_batches <= 0:
            raise ValueError(f"algorithm.filter_groups.max_inflight_gen_batches={max_inflight_gen_batches}: > 0")
        self.trainer_mode, self.trainer_config = trainer_mode, trainer_config
        self.threshold, self.strategy = max_off_policy_threshold, max_off_policy_strategy
        self.sampler_kwargs = dict(sampler_kwargs or {})
        self.refill_fn, self.metric = refill_fn, filter_groups_metric
        self.train_batch_size, self.gen_batch_size = train_batch_size, gen_batch_size
        self.inflight_limit = max_inflight_gen_batches * train_batch_size
        self.refill_failed = sync_refill_failed_groups
        self.poll_interval = poll_interval
        self._groups: dict[str, dict[str, PromptGroup]] = {}
        self._order = 0
        self._changed = threading.Condition()
        self._closed = False

    # ------------------------------------------------------------------ the producer's side
    def put_prompt(self, partition_id: str, uid: str, global_steps: int, status: str = "pending") -> None:
        """Record a dispatched prompt (or move it back to ``status``)."""
        self._check_status(status, uid)
        with self._changed:
            groups = self._groups.setdefault(partition_id, {})
            if uid in groups:
                groups[uid].status = status
            else:
                groups[uid] = PromptGroup(uid, int(global_steps), self._order, status)
                self._order += 1
            self._changed.notify_all()

    def put_trajectory(
        self, partition_id: str, uid: str, trajectory: Any, reward_extra_info: dict[str, Any] | None = None
    ) -> None:
        """Add one finished trajectory of prompt ``uid``."""
        with self._changed:
            group = self._group(partition_id, uid)
            group.trajectories.append(trajectory)
            group.reward_extra_info.append(dict(reward_extra_info or {}))
            self._changed.notify_all()

    def set_status(self, partition_id: str, uid: str, status: str) -> None:
        """Move prompt ``uid`` to ``status`` (``running``, ``finished``, ``failure``)."""
        self._check_status(status, uid)
        with self._changed:
            self._group(partition_id, uid).status = status
            self._changed.notify_all()

    def groups(self, partition_id: str) -> list[PromptGroup]:
        """The groups ``partition_id`` holds now, in dispatch order (a snapshot)."""
        with self._changed:
            return sorted(self._groups.get(partition_id, {}).values(), key=lambda g: g.order)

    def state_dict(self) -> dict[str, Any]:
        """The groups held, for a checkpoint taken when none is pending or running (raises otherwise)."""
        with self._changed:
            busy = [g.uid for groups in self._groups.values() for g in groups.values() if g.status not in TERMINAL]
            if busy:
                raise RuntimeError(f"a replay buffer with {len(busy)} groups still in flight cannot be saved")
            return {"order": self._order, "groups": {p: list(g.values()) for p, g in self._groups.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Hold what :meth:`state_dict` returned (the groups replace any held)."""
        with self._changed:
            self._order = int(state["order"])
            self._groups = {p: {g.uid: g for g in groups} for p, groups in state["groups"].items()}
            self._changed.notify_all()

    def clear(self, partition_id: str) -> None:
        """Forget every group of ``partition_id`` (a step abandoned when the data ran out)."""
        with self._changed:
            self._groups.pop(partition_id, None)
            self._changed.notify_all()

    def close(self) -> None:
        """Wake every waiting caller with :class:`ReplayBufferClosed`."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    # ------------------------------------------------------------------ the trainer's side
    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[list[PromptGroup], dict]:
        """Block until ``batch_size`` groups are sampleable; return the oldest ones (removed) and the metrics of
        the evictions made meanwhile."""
        metrics: dict[str, Any] = {}
        credit, refilled = 0, False
        while True:
            with self._changed:
                evicted = self._evict(global_steps, partition_id, metrics)
                credit += self._credit(evicted)
            replaced = self._replace(evicted)
            with self._changed:
                ready = self._sampleable(global_steps, partition_id)
                inflight = self._inflight(partition_id)
                drain = refilled and inflight > 0  # sync refills: the prompts in flight end before the batch
                if len(ready) >= batch_size and not self._blocked(global_steps, partition_id) and not drain:
                    return self._take(partition_id, ready, batch_size, metrics, discard_rest=refilled), metrics
                room = self.inflight_limit - inflight
                dispatch = min(credit, room) if credit and room > 0 and len(ready) < batch_size else 0
            if dispatch:
                credit, refilled = credit - dispatch, True
                self.refill_fn(dispatch)
            elif not replaced:
                self._wait()

    def get_sampleable_count(self, global_steps: int, partition_id: str) -> int:
        """How many groups a sample would find now (stale ones left out, nothing evicted or consumed)."""
        with self._changed:
            return len(self._sampleable(global_steps, partition_id, without_stale=True))

    def wait_for_sampleable(self, global_steps: int, partition_id: str, target_count: int) -> tuple[int, dict]:
        """Block until ``target_count`` groups are sampleable, evicting and refilling as :meth:`sample` does;
        consume nothing. Returns the count and the evictions' metrics."""
        metrics: dict[str, Any] = {}
        while True:
            with self._changed:
                evicted = self._evict(global_steps, partition_id, metrics)
            replaced = self._replace(evicted)
            with self._changed:
                count = len(self._sampleable(global_steps, partition_id))
                if count >= target_count:
                    return count, metrics
            if not replaced:
                self._wait()

    # ------------------------------------------------------------------ inside
    def _check_status(self, status: str, uid: str) -> None:
        if status not in STATUSES:
            raise ValueError(f"prompt {uid!r}: status {status!r}; use one of {STATUSES}")

    def _group(self, partition_id: str, uid: str) -> PromptGroup:
        group = self._groups.get(partition_id, {}).get(uid)
        if group is None:
            raise KeyError(f"prompt {uid!r} was never dispatched to partition {partition_id!r} (put_prompt first)")
        return group

    def _wait(self) -> None:
        with self._changed:
            if self._closed:
                raise ReplayBufferClosed("the replay buffer was closed")
            self._changed.wait(self.poll_interval)
            if self._closed:
                raise ReplayBufferClosed("the replay buffer was closed")

    def _inflight(self, partition_id: str) -> int:
        return sum(g.status not in TERMINAL for g in self._groups.get(partition_id, {}).values())

    def _blocked(self, global_steps: int, partition_id: str) -> bool:
        """``wait``: a pending or running group has reached the threshold."""
        if not self.is_async or self.strategy != "wait" or partition_id == "val":
            return False
        groups = self._groups.get(partition_id, {}).values()
        return any(g.status not in TERMINAL and g.age(global_steps) >= self.threshold for g in groups)

    def _is_stale(self, group: PromptGroup, global_steps: int) -> bool:
        return self.is_async and self.strategy == "drop" and group.age(global_steps) > self.threshold

    def _sampleable(self, global_steps: int, partition_id: str, without_stale: bool = False) -> list[PromptGroup]:
        groups = [g for g in self._groups.get(partition_id, {}).values() if g.status in TERMINAL]
        if without_stale and partition_id != "val":
            groups = [g for g in groups if not self._is_stale(g, global_steps)]
        return sorted(groups, key=lambda g: (g.global_steps, g.order))

    def _filtered_value(self, group: PromptGroup) -> float | None:
        """The value a DAPO-filtered group's trajectories share; None when the group is informative."""
        if not self.metric or group.status != "finished" or len(group.trajectories) <= 1:
            return None
        values = []
        for info in group.reward_extra_info:
            if self.metric not in info:
                raise ValueError(
                    f"algorithm.filter_groups.metric={self.metric!r}: prompt {group.uid!r} has a trajectory without "
                    f"it (its reward_extra_info keys: {sorted(info)})"
                )
            values.append(float(info[self.metric]))
        return values[0] if float(np.std(values)) == 0.0 else None

    def _evict(self, global_steps: int, partition_id: str, metrics: dict[str, Any]) -> dict[str, list[PromptGroup]]:
        """Remove the terminal groups to evict now, each once, by its first reason; add their metrics."""
        if partition_id == "val":
            return {}
        groups = self._groups.get(partition_id, {})
        evicted: dict[str, list[PromptGroup]] = {"stale": [], "filtered": [], "failed": []}
        filtered_values: Counter = Counter()
        for uid, group in list(groups.items()):
            if group.status not in TERMINAL:
                continue
            value = self._filtered_value(group)
            if self._is_stale(group, global_steps):
                reason = "stale"
            elif value is not None:
                reason = "filtered"
                filtered_values[value] += 1
            elif group.status == "failure" and (self.is_async or (self.refill_failed and not group.trajectories)):
                reason = "failed"
            else:
                continue
            evicted[reason].append(groups.pop(uid))
        prefix = "training" if partition_id == "train" else "validation"
        _add(metrics, f"{prefix}/off_policy/evicted_samples", len(evicted["stale"]))
        if evicted["stale"]:
            ages = [g.age(global_steps) for g in evicted["stale"]]
            key = f"{prefix}/off_policy/evicted_samples_staleness"
            before = metrics.get(f"{prefix}/off_policy/evicted_samples", 0) - len(ages)
            mean = metrics.get(f"{key}/mean", 0.0)
            metrics[f"{key}/mean"] = (mean * before + sum(ages)) / (before + len(ages))
            metrics[f"{key}/max"] = max(metrics.get(f"{key}/max", max(ages)), max(ages))
            metrics[f"{key}/min"] = min(metrics.get(f"{key}/min", min(ages)), min(ages))
        _add(metrics, f"{prefix}/filter_groups/evicted_samples", len(evicted["filtered"]))
        if filtered_values:
            merged = Counter(metrics.get(DAPO_FILTERED_REWARD_COUNTS_KEY, {})) + filtered_values
            metrics[DAPO_FILTERED_REWARD_COUNTS_KEY] = dict(merged)
        _add(metrics, f"{prefix}/rollout_failure/evicted_samples", len(evicted["failed"]))
        return {k: v for k, v in evicted.items() if v}

    def _credit(self, evicted: dict[str, list[PromptGroup]]) -> int:
        """Sync: the refill credit the evictions earn (2 per filtered group, 1 per failed one), spent under the
        in-flight bound."""
        return 2 * len(evicted.get("filtered", [])) + len(evicted.get("failed", []))

    def _replace(self, evicted: dict[str, list[PromptGroup]]) -> int:
        """Async: dispatch one new prompt per evicted group (outside the lock: the refill writes back into the
        buffer); the sync buffer refills from its credit instead. Returns how many were dispatched."""
        return 0

    def _take(
        self, partition_id: str, ready: list[PromptGroup], batch_size: int, metrics: dict, discard_rest: bool
    ) -> list[PromptGroup]:
        groups = self._groups[partition_id]
        taken = ready[:batch_size]
        for group in taken:
            del groups[group.uid]
        if discard_rest:  # sync DAPO: what the refills produced beyond the batch is not kept for the next step
            prefix = "training" if partition_id == "train" else "validation"
            for group in ready[batch_size:]:
                del groups[group.uid]
            _add(metrics, f"{prefix}/filter_groups/discarded_surplus_samples", len(ready) - batch_size)
        if not self.is_async and taken and not any(g.trajectories for g in taken):
            raise RuntimeError(
                f"partition {partition_id!r}: every sampled group failed without a trajectory; nothing to train "
                "(set trainer.v1.sampler.sync_refill_failed_groups=true to replace them)"
            )
        self._changed.notify_all()
        return taken


class ReplayBufferAsync(ReplayBuffer):
    """The async modes' buffer: stale groups dropped (``drop``) or waited for (``wait``), and every evicted group
    refilled one for one."""

    is_async = True

    def _credit(self, evicted: dict[str, list[PromptGroup]]) -> int:
        return 0

    def _replace(self, evicted: dict[str, list[PromptGroup]]) -> int:
        count = sum(len(v) for v in evicted.values())
        if count and self.refill_fn is None:
            raise ValueError(f"{count} groups were evicted and the buffer has no refill_fn to replace them")
        if count:
            self.refill_fn(count)
        return count


def _add(metrics: dict[str, Any], key: str, count: int) -> None:
    if count:
        metrics[key] = metrics.get(key, 0) + count
