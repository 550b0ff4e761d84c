"""`ColocateAsyncRolloutSource`'s schedule without Ray: which weight version generates which batch at a fixed lag,
the seeds, the queue a checkpoint holds, and the rollout filter. The trainer is test_rollout_source's stand-in (its
``_rollout`` scores instead of generating, recording the weight version it ran under); the loop below is the
order of ``fit()``'s calls (next_batch → update → before_weights → push → on_weights). The real generation, push
and resume run in tests/trainer/test_colocate_async.py."""

from __future__ import annotations

import time

import pytest

from tests.trainer.ppo.test_rollout_source import StandInTrainer, indices
from verl.trainer.ppo.colocate_async import ColocateAsyncRolloutSource
from verl.trainer.ppo.dynamic_sampling import StepState
from verl.trainer.ppo.rollout_source import get_rollout_source_class, registered_rollout_sources

GENERATE_S, TRAIN_S = 0.1, 0.02  # the stand-in's generation of a batch, the step's training between take and push


class AheadTrainer(StandInTrainer):
    """The stand-in with the async settings, several epochs, and a ``_rollout`` that records (prompts, weight
    version, seed step) on the source's generation thread, each generation taking ``GENERATE_S``."""

    def __init__(self, max_lag: int, total_steps: int, filter_groups: bool = False, epochs: int = 3):
        super().__init__(filter_groups=filter_groups)
        self.config.async_training = {"max_lag": max_lag}
        self.config.trainer.mode = "colocate_async"
        self.state.global_steps = 0
        self.prompts.total_epochs = epochs
        self.total_training_steps = total_steps
        self.generated: list[tuple[list[int], int, int]] = []
        self.generated_in: list[int] = []  # the training step in progress during each generation

    def _rollout(self, prompts, step, *, epoch=None, seed_step=None):
        self.generated.append((indices(prompts), self.state.weight_version, seed_step))
        self.generated_in.append(self.state.global_steps)
        time.sleep(GENERATE_S)
        return super()._rollout(prompts, step)


def train(trainer: AheadTrainer, source: ColocateAsyncRolloutSource, steps: int) -> list[list[int]]:
    """``steps`` steps of fit()'s calls (training takes ``TRAIN_S``); returns each step's trained prompts. Checks each
    step's wait for generation and the trainer's idle ratio (the wait over the step's time)."""
    trained = []
    for _ in range(steps):
        trainer.state.global_steps += 1
        step = StepState(metrics={})
        start = time.perf_counter()
        batch = source.next_batch(step)
        trained.append(sorted({int(u) for u in batch.non_tensor_batch["uid"]}))
        time.sleep(TRAIN_S)
        source.before_weights(step)
        seconds = time.perf_counter() - start  # the step so far, a little more than the source's own measure
        assert not any(g.future is not None and not g.future.done() for g in source._queue)  # nothing in flight
        trainer.state.weight_version += 1
        source.on_weights(trainer.state.weight_version)
        waited, idle = step.timing["wait_rollout"], step.metrics["trainer/idle_ratio"]
        # the trainer waits for the generations of its step (all but the TRAIN_S a top-up overlaps), never while it
        # trains; the half is the margin for a loaded machine
        generations = trainer.generated_in.count(trainer.state.global_steps)
        assert generations * GENERATE_S / 2 <= waited <= seconds - 0.99 * TRAIN_S, (generations, waited, seconds)
        # idle = waited / step time, which lies between the waits plus the training and the step measured here
        assert waited / seconds <= idle <= waited / (waited + 0.99 * TRAIN_S), (waited, seconds, idle)
    return trained


@pytest.mark.parametrize("max_lag", [0, 1, 2])
def test_batch_j_is_generated_by_version_j_minus_lag_and_seeded_by_step_j_plus_1(max_lag):
    trainer = AheadTrainer(max_lag, total_steps=5)
    source = get_rollout_source_class("colocate_async")(trainer.rollouter())
    trained = train(trainer, source, 5)
    source.close()
    # 10 prompts, batches of 4: [0..3], [4..7] per epoch
    assert trained == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2 + [[0, 1, 2, 3]]
    assert [version for _, version, _ in trainer.generated] == [max(0, j - max_lag) for j in range(5)]
    assert [seed for _, _, seed in trainer.generated] == [1, 2, 3, 4, 5]  # as sync: the training step's number
    assert "colocate_async" in registered_rollout_sources()


def test_the_queue_a_checkpoint_holds_is_handed_out_first_after_a_resume():
    trainer = AheadTrainer(max_lag=2, total_steps=5)
    source = ColocateAsyncRolloutSource(trainer.rollouter())
    train(trainer, source, 2)
    saved = source.state_dict()  # after step 2's push: batches 2 and 3 generated, not trained
    assert [entry["index"] for entry in saved["ready"]] == [2, 3] and saved["next_index"] == 4
    assert [entry["weight_version"] for entry in saved["ready"]] == [0, 1]
    source.close()

    resumed = ColocateAsyncRolloutSource(trainer.rollouter())
    resumed.load_state_dict(saved)
    trainer.generated.clear()
    assert train(trainer, resumed, 3) == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    assert [(version, seed) for _, version, seed in trainer.generated] == [(2, 5)]  # only batch 4 is new
    with pytest.raises(ValueError, match="rollout-source state \\['queue'\\]"):
        resumed.load_state_dict({"queue": []})
    resumed.close()


def test_a_filter_takes_generation_batches_in_order_generating_more_when_the_queue_runs_dry():
    # DAPO's filter over the stand-in's scores: 2 informative prompts per batch of 4, so a step takes 2 batches
    trainer = AheadTrainer(max_lag=1, total_steps=2, filter_groups=True, epochs=2)
    source = ColocateAsyncRolloutSource(trainer.rollouter())
    assert train(trainer, source, 2) == [[1, 3, 5, 7], [1, 3, 5, 7]]
    # step 1 generates batches 0 and 1 on demand and batch 2 ahead (version 0); step 2 takes batch 2, then
    # generates batch 3 on demand with version 1: with a filter the lag is a bound, each batch seeded by its number
    assert [(version, seed) for _, version, seed in trainer.generated] == [(0, 1), (0, 2), (0, 3), (1, 4)]
    assert source.next_batch(StepState(metrics={})) is None  # two epochs of 2 batches: the data ran out
    source.close()
