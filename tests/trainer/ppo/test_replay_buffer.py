"""veRL 0.10's replay-buffer semantics (verl.trainer.ppo.v1.replay_buffer) with real producer and consumer threads:
each eviction reason with its refill count, ``wait`` never handing out a batch while a group at the threshold is
in flight, sync DAPO's credits, bounded in-flight refills and surplus discard, validation never evicting."""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from verl.trainer.ppo.v1.replay_buffer import (
    DAPO_FILTERED_REWARD_COUNTS_KEY,
    ReplayBuffer,
    ReplayBufferAsync,
    ReplayBufferClosed,
)

POLL = 0.02
_uids = (f"p{i}" for i in itertools.count())


def put(rb, partition, status="finished", step=0, rewards=(1.0,), uid=None):
    """Dispatch one prompt and write its trajectories (one per reward, ``acc`` in their extra info) then its
    status, as a rollouter does; returns its uid."""
    uid = uid or next(_uids)
    rb.put_prompt(partition, uid, step)
    if status in ("finished", "failure"):
        for r in rewards:
            rb.put_trajectory(partition, uid, {"uid": uid, "acc": r}, {"acc": r})
    rb.set_status(partition, uid, status)
    return uid


class Refiller:
    """``refill_fn``: dispatches k new prompts, finished at once with the given rewards."""

    def __init__(self, partition, step=0, rewards=(1.0,)):
        self.partition, self.step, self.rewards = partition, step, rewards
        self.calls, self.uids = [], []
        self.rb = None

    def __call__(self, k):
        self.calls.append(k)
        self.uids += [put(self.rb, self.partition, step=self.step, rewards=self.rewards) for _ in range(k)]
        return k


def buffer(async_=False, refill=None, **kwargs):
    cls = ReplayBufferAsync if async_ else ReplayBuffer
    rb = cls(trainer_mode="colocate_async" if async_ else "sync", refill_fn=refill, poll_interval=POLL, **kwargs)
    if refill is not None:
        refill.rb = rb
    return rb


class Consumer(threading.Thread):
    def __init__(self, call):
        super().__init__(daemon=True)
        self.call, self.result, self.error = call, None, None

    def run(self):
        try:
            self.result = self.call()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def outcome(self, timeout=10.0):
        self.join(timeout)
        assert not self.is_alive(), "the consumer is still blocked"
        if self.error is not None:
            raise self.error
        return self.result


def uids(groups):
    return [g.uid for g in groups]


def test_settings_are_checked_by_name():
    with pytest.raises(ValueError, match="max_off_policy_threshold=0"):
        ReplayBuffer(max_off_policy_threshold=0)
    with pytest.raises(ValueError, match=r"max_off_policy_strategy='skip'; use one of"):
        ReplayBuffer(max_off_policy_strategy="skip")
    with pytest.raises(ValueError, match="filter_groups needs a refill_fn"):
        ReplayBuffer(filter_groups_metric="acc")
    with pytest.raises(ValueError, match="sync_refill_failed_groups needs data.gen_batch_size=1"):
        ReplayBuffer(sync_refill_failed_groups=True, refill_fn=len, gen_batch_size=2)
    with pytest.raises(KeyError, match="never dispatched"):
        ReplayBuffer().set_status("train", "ghost", "finished")


def test_oldest_groups_first_and_a_consumer_waits_for_enough():
    rb = buffer()
    late, early = put(rb, "train", step=3), put(rb, "train", step=1)
    consumer = Consumer(lambda: rb.sample(global_steps=3, partition_id="train", batch_size=3))
    consumer.start()
    time.sleep(POLL * 5)
    assert consumer.is_alive()  # 2 of 3
    third = put(rb, "train", step=2)
    groups, metrics = consumer.outcome()
    assert uids(groups) == [early, third, late] and metrics == {}
    assert groups[0].trajectories == [{"uid": early, "acc": 1.0}]
    assert rb.get_sampleable_count(3, "train") == 0  # taken: removed


def test_drop_evicts_stale_groups_and_refills_as_many():
    refill = Refiller("train", step=5)
    rb = buffer(async_=True, refill=refill, max_off_policy_threshold=2)
    stale, boundary, fresh = (put(rb, "train", step=s) for s in (0, 4, 5))
    running = put(rb, "train", status="running", step=0)
    assert rb.get_sampleable_count(5, "train") == 2  # the stale one left out, nothing consumed
    groups, metrics = rb.sample(global_steps=5, partition_id="train", batch_size=3)
    assert refill.calls == [1] and set(uids(groups)) == {boundary, fresh, refill.uids[0]}
    assert stale not in uids(groups) and running not in uids(groups)
    assert metrics == {
        "training/off_policy/evicted_samples": 1,
        "training/off_policy/evicted_samples_staleness/mean": 6,
        "training/off_policy/evicted_samples_staleness/max": 6,
        "training/off_policy/evicted_samples_staleness/min": 6,
    }


def test_wait_blocks_while_a_group_at_the_threshold_is_in_flight_and_drops_nothing():
    rb = buffer(async_=True, max_off_policy_threshold=2, max_off_policy_strategy="wait")
    fresh = [put(rb, "train", step=5) for _ in range(2)]
    old = put(rb, "train", status="running", step=0)
    very_old = put(rb, "train", step=-90)
    consumer = Consumer(lambda: rb.sample(global_steps=5, partition_id="train", batch_size=3))
    consumer.start()
    time.sleep(POLL * 5)
    assert consumer.is_alive()  # 3 are sampleable, but a group of age 6 ≥ 2 is still generating
    rb.put_trajectory("train", old, {"uid": old}, {})
    rb.set_status("train", old, "finished")
    groups, metrics = consumer.outcome()
    assert uids(groups) == [very_old, old, fresh[0]] and metrics == {}  # the stale ones trained, oldest first


def test_async_filtered_and_failed_groups_are_refilled_one_for_one_and_counted_once():
    refill = Refiller("train", step=1, rewards=(0.0, 1.0))
    rb = buffer(async_=True, refill=refill, filter_groups_metric="acc", max_off_policy_threshold=1)
    all_right = put(rb, "train", step=1, rewards=(1.0, 1.0))
    all_wrong = put(rb, "train", step=1, rewards=(0.0, 0.0))
    failed = put(rb, "train", status="failure", step=1, rewards=())
    stale_and_flat = put(rb, "train", step=0, rewards=(0.0, 0.0))  # age 2 > 1 and no variance: one eviction
    mixed = put(rb, "train", step=1, rewards=(0.0, 1.0))
    groups, metrics = rb.sample(global_steps=1, partition_id="train", batch_size=3)
    assert refill.calls == [4] and uids(groups) == [mixed, *refill.uids[:2]]
    assert not {all_right, all_wrong, failed, stale_and_flat} & set(uids(groups))
    assert metrics["training/off_policy/evicted_samples"] == 1
    assert metrics["training/filter_groups/evicted_samples"] == 2
    assert metrics["training/rollout_failure/evicted_samples"] == 1
    assert metrics[DAPO_FILTERED_REWARD_COUNTS_KEY] == {1.0: 1, 0.0: 1}


def test_a_filtered_group_without_the_metric_is_an_error_naming_it():
    rb = buffer(refill=Refiller("train"), filter_groups_metric="acc")
    uid = next(_uids)
    rb.put_prompt("train", uid, 0)
    for _ in range(2):
        rb.put_trajectory("train", uid, {}, {"score": 1.0})
    rb.set_status("train", uid, "finished")
    with pytest.raises(ValueError, match=rf"metric='acc': prompt '{uid}' has a trajectory without it"):
        rb.sample(global_steps=0, partition_id="train", batch_size=1)


def test_sync_dapo_refills_twice_the_filtered_and_discards_the_surplus():
    refill = Refiller("train", step=1, rewards=(0.0, 1.0))
    rb = buffer(refill=refill, filter_groups_metric="acc", train_batch_size=2, max_inflight_gen_batches=1)
    flat, mixed = put(rb, "train", rewards=(0.0, 0.0)), put(rb, "train", rewards=(0.0, 1.0))
    groups, metrics = rb.sample(global_steps=1, partition_id="train", batch_size=2)
    assert refill.calls == [2] and uids(groups) == [mixed, refill.uids[0]] and flat not in uids(groups)
    assert metrics["training/filter_groups/evicted_samples"] == 1
    assert metrics["training/filter_groups/discarded_surplus_samples"] == 1
    assert rb.get_sampleable_count(2, "train") == 0  # the surplus is not kept for the next step


def test_sync_dapo_refills_under_the_in_flight_bound_and_drains_before_sampling():
    refill = Refiller("train", step=1, rewards=(0.0, 1.0))
    rb = buffer(refill=refill, filter_groups_metric="acc", train_batch_size=2, max_inflight_gen_batches=1)
    put(rb, "train", rewards=(0.0, 0.0))
    slow = put(rb, "train", status="running")
    consumer = Consumer(lambda: rb.sample(global_steps=1, partition_id="train", batch_size=2))
    consumer.start()
    deadline = time.monotonic() + 5
    while len(refill.calls) < 2 and time.monotonic() < deadline:
        time.sleep(POLL)
    time.sleep(POLL * 5)
    assert refill.calls == [1, 1] and consumer.is_alive()  # one slot free at a time; the slow prompt in flight
    rb.put_trajectory("train", slow, {}, {"acc": 0.0})
    rb.put_trajectory("train", slow, {}, {"acc": 1.0})
    rb.set_status("train", slow, "finished")
    groups, metrics = consumer.outcome()
    assert uids(groups) == [slow, refill.uids[0]]
    assert metrics["training/filter_groups/discarded_surplus_samples"] == 1


def test_sync_failed_groups_are_kept_padded_replaced_on_request_or_an_error_when_all_empty():
    rb = buffer()
    failed, done = put(rb, "train", status="failure", rewards=(1.0,)), put(rb, "train")
    groups, metrics = rb.sample(global_steps=0, partition_id="train", batch_size=2)
    assert uids(groups) == [failed, done] and metrics == {}  # a failed group stays sampleable (padded later)
    put(rb, "train", status="failure", rewards=())
    with pytest.raises(RuntimeError, match="every sampled group failed without a trajectory"):
        rb.sample(global_steps=0, partition_id="train", batch_size=1)
    refill = Refiller("train")
    rb = buffer(refill=refill, sync_refill_failed_groups=True)
    empty, kept = put(rb, "train", status="failure", rewards=()), put(rb, "train", status="failure")
    groups, metrics = rb.sample(global_steps=0, partition_id="train", batch_size=2)
    assert refill.calls == [1] and uids(groups) == [kept, refill.uids[0]] and empty not in uids(groups)
    assert metrics == {"training/rollout_failure/evicted_samples": 1}


def test_validation_never_evicts():
    refill = Refiller("val")
    rb = buffer(async_=True, refill=refill, filter_groups_metric="acc", max_off_policy_threshold=1)
    flat, failed = put(rb, "val", step=0, rewards=(1.0, 1.0)), put(rb, "val", status="failure", step=0)
    groups, metrics = rb.sample(global_steps=5, partition_id="val", batch_size=2)
    assert uids(groups) == [flat, failed] and refill.calls == [] and metrics == {}


def test_wait_for_sampleable_consumes_nothing_and_replaces_what_sample_would_evict():
    refill = Refiller("train", step=5)
    rb = buffer(async_=True, refill=refill, max_off_policy_threshold=1)
    stale = put(rb, "train", step=0)
    count, metrics = rb.wait_for_sampleable(global_steps=5, partition_id="train", target_count=1)
    assert count == 1 and refill.calls == [1] and metrics["training/off_policy/evicted_samples"] == 1
    groups, _ = rb.sample(global_steps=5, partition_id="train", batch_size=1)
    assert uids(groups) == refill.uids and stale not in uids(groups)


def test_close_wakes_a_blocked_consumer():
    rb = buffer()
    consumer = Consumer(lambda: rb.sample(global_steps=0, partition_id="train", batch_size=1))
    consumer.start()
    time.sleep(POLL * 3)
    rb.close()
    with pytest.raises(ReplayBufferClosed):
        consumer.outcome()
