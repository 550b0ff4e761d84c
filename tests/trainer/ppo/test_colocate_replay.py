"""`ColocateReplaySource` (colocate_async under trainer.v1.sampler.schedule=replay_buffer) without Ray: the same
stand-in trainer and step loop as test_colocate_async_source (its ``_rollout`` scores on the source's generation
thread instead of generating, recording prompts, weight version and seed), with the real ReplayBufferAsync."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.trainer.ppo.test_colocate_async_source import AheadTrainer, train
from verl.experimental.agent_loop.failures import FAILED_COLUMN
from verl.trainer.ppo.dynamic_sampling import StepState
from verl.trainer.ppo.rollout_source import get_rollout_source_class
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync


def buffered(trainer: AheadTrainer, **sampler):
    trainer.config.trainer.v1.sampler.schedule = "replay_buffer"
    for key, value in sampler.items():
        trainer.config.trainer.v1.sampler[key] = value
    return get_rollout_source_class("colocate_async", "replay_buffer")(trainer.rollouter())


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_without_a_filter_warmup_batches_give_the_fixed_lag_schedule(warmup):
    runs = {}
    for schedule in ("fixed_lag", "replay_buffer"):
        trainer = AheadTrainer(warmup, total_steps=5)
        source = (
            buffered(trainer)
            if schedule == "replay_buffer"
            else get_rollout_source_class("colocate_async")(trainer.rollouter())
        )
        runs[schedule] = (train(trainer, source, 5), trainer.generated)
        source.close()
    assert runs["replay_buffer"] == runs["fixed_lag"]  # trained prompts; generated prompts, versions and seeds
    assert [version for _, version, _ in runs["fixed_lag"][1]] == [max(0, j - warmup) for j in range(5)]


def test_dapo_filtered_groups_are_refilled_one_for_one_and_the_rest_kept_for_later():
    # the stand-in's even prompts score alike (filtered), its odd ones do not
    trainer = AheadTrainer(max_lag=1, total_steps=2, filter_groups=True, epochs=3)
    source = buffered(trainer)
    steps = []
    for _ in range(2):
        trainer.state.global_steps += 1
        step = StepState(metrics={})
        batch = source.next_batch(step)
        steps.append((sorted({int(u) for u in batch.non_tensor_batch["uid"]}), step.metrics))
        source.before_weights(step)
        trainer.state.weight_version += 1
    sizes = [len(prompts) for prompts, _, _ in trainer.generated]
    evicted = [m["training/filter_groups/evicted_samples"] for _, m in steps]
    # two batches of 4 (step 1 and its warm-up) and refills of exactly as many prompts as groups were evicted
    assert sizes[:2] == [4, 4] and sum(sizes[2:]) == sum(evicted) and sum(evicted) > 0
    assert all(i % 2 for trained, _ in steps for i in trained)  # only informative groups are trained
    assert all(m["training/filter_groups/discarded_surplus_samples"] == 0 for _, m in steps)  # async: kept, not cut
    source.close()


def test_a_stale_group_is_dropped_and_refilled_with_a_fresh_prompt():
    # 2 warm-up batches with a threshold of 2 versions: step 3's oldest batch (dispatched at step 1) is 3 old
    trainer = AheadTrainer(max_lag=2, total_steps=3, epochs=3)
    source = buffered(trainer, max_off_policy_threshold=2)
    metrics = []
    for _ in range(3):
        trainer.state.global_steps += 1
        step = StepState(metrics={})
        source.next_batch(step)
        metrics.append(step.metrics)
        source.before_weights(step)
        trainer.state.weight_version += 1
    assert [m.get("training/off_policy/evicted_samples", 0) for m in metrics] == [0, 0, 4]
    assert metrics[2]["training/off_policy/evicted_samples_staleness/max"] == 3
    # three batches dispatched at step 1 (versions 0), then 4 prompts generated at step 3 with version 2
    assert [(len(p), version) for p, version, _ in trainer.generated] == [(4, 0), (4, 0), (4, 0), (4, 2)]
    source.close()


class FailingTrainer(AheadTrainer):
    """The stand-in whose agent loop fails on the first sample of the prompts in ``failing`` (``__failed__``, as
    verl.experimental.agent_loop.failures marks them), the first time each is generated."""

    def __init__(self, failing, **kwargs) -> None:
        super().__init__(**kwargs)
        self.failing = set(failing)

    def _rollout(self, prompts, step, *, epoch=None, seed_step=None):
        batch = super()._rollout(prompts, step, epoch=epoch, seed_step=seed_step)
        rows = [int(u) for u in batch.non_tensor_batch["uid"]]
        failed = [i in self.failing and (k == 0 or rows[k - 1] != i) for k, i in enumerate(rows)]
        self.failing -= set(rows)
        batch.non_tensor_batch[FAILED_COLUMN] = np.array(failed, dtype=bool)
        return batch


def test_a_group_with_a_failed_sample_is_evicted_and_refilled_one_for_one():
    trainer = FailingTrainer(failing=[1, 2], max_lag=0, total_steps=1)
    source = buffered(trainer)
    assert source.keeps_failed_samples  # the trainer asks the agent loops to keep failed samples
    trainer.state.global_steps += 1
    step = StepState(metrics={})
    batch = source.next_batch(step)
    # prompts 0..3, of which 1 and 2 failed: replaced by 4 and 5 (two prompts, one generation)
    assert [(p, v) for p, v, _ in trainer.generated] == [([0, 1, 2, 3], 0), ([4, 5], 0)]
    assert sorted({int(u) for u in batch.non_tensor_batch["uid"]}) == [0, 3, 4, 5]
    assert not batch.non_tensor_batch[FAILED_COLUMN].any()
    assert step.metrics["training/rollout_failure/evicted_samples"] == 2
    source.close()


class AgeRecorder(ReplayBufferAsync):
    """A user's sampler (``custom_sampler``) that records the age of every group it hands out."""

    ages: list[list[int]] = []

    def sample(self, global_steps, partition_id, batch_size):
        groups, metrics = super().sample(global_steps, partition_id, batch_size)
        AgeRecorder.ages.append([group.age(global_steps) for group in groups])
        return groups, metrics


def test_wait_trains_no_group_past_the_threshold():
    """``wait`` evicts nothing: with one batch ahead and a threshold of 2 versions (start-up refuses a warm-up that
    would pass it), DAPO's refills and kept groups included, no group is trained older than 2."""
    AgeRecorder.ages = []
    trainer = AheadTrainer(max_lag=1, total_steps=4, filter_groups=True, epochs=4)
    custom = {"path": f"pkg://{__name__}", "name": "AgeRecorder"}
    source = buffered(trainer, max_off_policy_threshold=2, max_off_policy_strategy="wait", custom_sampler=custom)
    trained = train_steps(trainer, source, 4)
    source.close()
    assert len(AgeRecorder.ages) == 4 and all(len(ages) == 4 for ages in AgeRecorder.ages)
    assert max(max(ages) for ages in AgeRecorder.ages) == 2 and all(len(uids) == 8 for uids in trained)


def test_a_checkpoint_resumes_the_same_schedule():
    straight = AheadTrainer(max_lag=1, total_steps=4, filter_groups=True, epochs=4)
    source = buffered(straight)
    expected = train_steps(straight, source, 4)
    source.close()

    trainer = AheadTrainer(max_lag=1, total_steps=4, filter_groups=True, epochs=4)
    source = buffered(trainer)
    first = train_steps(trainer, source, 2)
    saved = source.state_dict()
    source.close()
    resumed = buffered(trainer)
    resumed.load_state_dict(saved)
    assert first + train_steps(trainer, resumed, 2) == expected
    with pytest.raises(ValueError, match=r"rollout-source state \['next_index', 'ready'\]"):
        resumed.load_state_dict({"next_index": 0, "ready": []})  # the fixed-lag source's state
    resumed.close()


def train_steps(trainer: AheadTrainer, source, steps: int) -> list[list[str]]:
    """fit()'s calls for ``steps`` steps (no timing checks); each step's trained uids in order."""
    out = []
    for _ in range(steps):
        trainer.state.global_steps += 1
        step = StepState(metrics={})
        batch = source.next_batch(step)
        out.append(list(batch.non_tensor_batch["uid"]))
        source.before_weights(step)
        trainer.state.weight_version += 1
    return out


class ServersRecorder:
    """Stands in for the rollout pool's worker group (no Ray here): records which staged version each load asks."""

    def __init__(self) -> None:
        self.loads: list[int] = []

    def apply_weights(self, version: int, drop_older: bool = True) -> list[int]:
        self.loads.append(version)
        return [version]


def test_separate_async_streams_mini_batches_from_the_buffer_dapo_refills_included():
    """separate_async's replay-buffer source: a step is handed out in parameter_sync_step parts of ppo_mini_batch_size
    groups; DAPO's flat groups are evicted and refilled one for one; each generation first loads the version its
    dispatch was made under."""
    trainer = AheadTrainer(max_lag=1, total_steps=2, filter_groups=True, epochs=4)
    trainer.config.actor_rollout_ref.actor = {"ppo_mini_batch_size": 2}
    trainer.config.trainer.v1.sampler.schedule = "replay_buffer"
    trainer.rollout_wg = ServersRecorder()
    source = get_rollout_source_class("separate_async", "replay_buffer")(trainer.rollouter())
    assert source.parts_per_step == 2 and source.part_size == 2 and source.keeps_failed_samples
    evicted = 0
    for _ in range(2):
        trainer.state.global_steps += 1
        step = StepState(metrics={})
        parts = []
        for _ in range(source.parts_per_step):  # as the trainer's _train_parts: each part its own metrics
            part = dataclasses.replace(step, metrics={})
            parts.append(source.next_batch(part))
            evicted += part.metrics.get("training/filter_groups/evicted_samples", 0)
        assert [len({str(u) for u in part.non_tensor_batch["uid"]}) for part in parts] == [2, 2]
        assert all(int(u) % 2 for part in parts for u in part.non_tensor_batch["uid"])  # only informative groups
        source.before_weights(step)
        trainer.state.weight_version += 1
        source.on_weights(trainer.state.weight_version)
    sizes = [len(prompts) for prompts, _, _ in trainer.generated]
    assert sizes[:2] == [4, 4] and sum(sizes[2:]) == evicted > 0  # step 1 and its warm-up, then one-for-one refills
    versions = [version for _, version, _ in trainer.generated]
    assert trainer.rollout_wg.loads == sorted(set(versions))  # each version loaded once, before its first generation
    source.close()
