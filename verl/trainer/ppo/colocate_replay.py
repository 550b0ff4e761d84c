"""``colocate_async`` under veRL 0.10's replay-buffer schedule (``trainer.v1.sampler.schedule=replay_buffer``).

As veRL's: ``trainer.v1.colocate_async.num_warmup_batches`` (W, here also ``async_training.max_lag``) batches of
``data.train_batch_size`` prompts are dispatched before step 1 and one more at each step; the step's training batch
is what a :class:`~verl.trainer.ppo.v1.replay_buffer.ReplayBufferAsync` samples: the oldest finished prompt groups,
with stale ones (age > ``max_off_policy_threshold``) evicted and refilled one for one (``drop``) or waited for
(``wait``), and DAPO-filtered ones evicted and refilled one for one; groups beyond the batch stay for later steps.

Each dispatch is one generation job on the source's generation thread (the fixed-lag source's), run in order with
the weights the servers hold when it starts. Before a push the trainer waits for the jobs in flight: veRL aborts
them and resumes them under the new weights, which needs partial rollout (not built for this mode), so here every
group comes from one weight version. Without a filter and with nothing stale, W warm-up batches give the fixed-lag
schedule at ``max_lag`` = W batch for batch: the same prompts, weight versions and seeds (a test checks it). No batch
is dispatched beyond the steps left to train.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from verl.protocol import DataProto
from verl.trainer.ppo.colocate_async import ColocateAsyncRolloutSource, Generation
from verl.trainer.ppo.dynamic_sampling import StepState
from verl.trainer.ppo.replay_batches import (
    DataRanOut,
    PromptPool,
    add_sample_metrics,
    buffer_kwargs,
    record_groups,
    sampler_class,
)
from verl.trainer.ppo.rollout_source import RolloutSource, refuse_own_rollout_filter, register_rollout_source
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferClosed

if TYPE_CHECKING:
    from verl.trainer.ppo.rollout_source import Rollouter

__all__ = ["ColocateReplaySource"]

TRAIN = "train"
STATE_KEYS = {"dispatched", "regular", "buffer", "batches", "jobs", "prompt_pool"}


@register_rollout_source("colocate_async", schedule="replay_buffer")
class ColocateReplaySource(ColocateAsyncRolloutSource):
    """``trainer.mode=colocate_async`` with ``trainer.v1.sampler.schedule=replay_buffer`` (see the module
    docstring)."""

    keeps_failed_samples = True  # a group with a failed sample is evicted and refilled

    def __init__(self, rollouter: Rollouter) -> None:
        super().__init__(rollouter)
        r = rollouter
        refuse_own_rollout_filter(r, "replay_buffer")
        config = r.config
        self.train_batch_size = int(config.data.train_batch_size)
        kwargs = buffer_kwargs(config, "colocate_async", self._refill)
        self.metric = kwargs["filter_groups_metric"]
        self.buffer = sampler_class(config.trainer.v1.sampler, is_async=True)(**kwargs)
        self.pool = PromptPool(r.prompts, lambda: r.state.epoch)
        self._batches: dict[int, DataProto] = {}  # dispatch number → its scored batch, while a group refers to it
        self._regular = 0  # the batches dispatched for steps (warm-up included), not refills
        self._dispatching_step = 0
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ the schedule
    def next_batch(self, step: StepState) -> DataProto | None:
        self._begin_step(step)
        return self._sample(step, self.train_batch_size)

    def _begin_step(self, step: StepState) -> None:
        """A step starts: dispatch up to W batches ahead of it (none past the last step)."""
        r = self.rollouter
        self._waited, self._step_start, self._step = 0.0, time.perf_counter(), step
        step.metrics["fully_async/count/current_param_version"] = r.state.weight_version
        global_steps = r.state.global_steps
        self._dispatching_step = global_steps
        wanted = min(global_steps + self.max_lag, r.total_training_steps)
        while self._regular < wanted and self._dispatch(self.train_batch_size):
            self._regular += 1

    def _sample(self, step: StepState, size: int) -> DataProto | None:
        """``size`` groups sampled from the buffer as one batch (timings, metrics and the wait into ``step``); None
        when the data ran out."""
        if len(self.buffer.groups(TRAIN)) < size:  # nothing more to come: the data ran out
            self.data_ran_out(step)
            return None
        start = time.perf_counter()
        try:
            groups, metrics = self.buffer.sample(self.rollouter.state.global_steps, TRAIN, size)
        except DataRanOut:
            self.data_ran_out(step)
            return None
        except ReplayBufferClosed:
            if self._error is not None:
                raise self._error from None
            raise
        finally:
            self._waited += time.perf_counter() - start
        self._take_finished(step, max(d for group in groups for d, _ in group.trajectories))
        add_sample_metrics(step, metrics, filtering=bool(self.metric))
        batch = DataProto.concat([self._batches[d].select_idxs([r for _, r in rows]) for d, rows in _runs(groups)])
        self._forget_unreferenced()
        step.timing["wait_rollout"] = self._waited
        return batch

    def _dispatch(self, k: int) -> bool:
        """Queue the generation of ``k`` new prompts (their groups pending in the buffer); False when the data ran
        out first."""
        r = self.rollouter
        parts = self.pool.take(k)
        if parts is None:
            return False
        for epoch, prompts in parts:
            generation = Generation(self._next_index, epoch, r.state.weight_version)
            self._next_index += 1
            keys = [f"{generation.index}:{p}" for p in range(len(prompts))]
            for key in keys:
                self.buffer.put_prompt(TRAIN, key, self._dispatching_step)
            generation.future = self._thread.submit(self._generate_into_buffer, generation, prompts, keys)
            self._queue.append(generation)
        return True

    def _refill(self, k: int) -> None:
        """The buffer evicted ``k`` groups: dispatch as many new prompts (on the trainer's thread, inside
        ``sample``)."""
        if not self._dispatch(k):
            raise DataRanOut

    def _generate_into_buffer(self, generation: Generation, prompts: DataProto, keys: list[str]) -> DataProto:
        """On the generation thread: generate and score, then record each prompt's group as finished."""
        try:
            batch = self._generate(generation, prompts)
            self._batches[generation.index] = batch
            record_groups(self.buffer, batch, lambda row: (generation.index, row), self.metric, keys)
            return batch
        except BaseException as e:  # the sampler would wait for these groups forever: wake it with the error
            self._error = e
            self.buffer.close()
            raise

    def _take_finished(self, step: StepState, last: int) -> None:
        """Account the finished generation jobs at the queue's head up to dispatch ``last`` (the newest the batch
        draws on): their timings and metrics go to ``step``, the fixed-lag source's rule for the batch it hands
        out."""
        while (
            self._queue
            and self._queue[0].index <= last
            and (self._queue[0].future is None or self._queue[0].future.done())
        ):
            generation = self._queue.popleft()
            self._result(generation, waited=False)
            for key, seconds in generation.timing.items():
                step.timing[key] = step.timing.get(key, 0.0) + seconds
            for key, value in generation.metrics.items():
                step.metrics.setdefault(key, value)

    def _forget_unreferenced(self) -> None:
        """Drop the scored batches no held group and no job in flight refers to."""
        live = {d for group in self.buffer.groups(TRAIN) for d, _ in group.trajectories}
        live |= {g.index for g in self._queue}
        for index in [d for d in self._batches if d not in live]:
            del self._batches[index]

    def _top_up(self) -> None:
        """Dispatches come from :meth:`next_batch` and the buffer's refills only."""

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The groups the buffer holds with their batches, the prompts left of a loader batch, the counters. Written
        after the push, when nothing is in flight (in a step without a push it is waited for first)."""
        self.wait_idle()
        self._forget_unreferenced()
        return {
            "dispatched": self._next_index,
            "regular": self._regular,
            "buffer": self.buffer.state_dict(),
            "batches": dict(self._batches),
            "jobs": [{**g.state(), "batch": None} for g in self._queue],  # done, not yet accounted to a step
            "prompt_pool": self.pool.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if set(state) != STATE_KEYS:
            RolloutSource.load_state_dict(self, state)  # another schedule's state: refused, naming it
        self._next_index, self._regular = int(state["dispatched"]), int(state["regular"])
        self.buffer.load_state_dict(state["buffer"])
        self._batches = dict(state["batches"])
        self._queue.clear()
        for entry in state["jobs"]:
            self._queue.append(Generation(**{**entry, "batch": self._batches.get(entry["index"])}))
        self.pool.load_state_dict(state["prompt_pool"])

    def close(self) -> None:
        self.buffer.close()
        super().close()


def _runs(groups: list[Any]) -> list[tuple[int, list[tuple[int, int]]]]:
    """The sampled groups' trajectory refs ``(dispatch, row)`` in order, cut into runs of one dispatch each."""
    runs: list[tuple[int, list[tuple[int, int]]]] = []
    for group in groups:
        for dispatch, row in group.trajectories:
            if runs and runs[-1][0] == dispatch:
                runs[-1][1].append((dispatch, row))
            else:
                runs.append((dispatch, [(dispatch, row)]))
    return runs
