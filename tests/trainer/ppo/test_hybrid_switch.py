"""`HybridSwitch`'s decisions (veRL 0.10's hybrid_rollout rules) over a real ReplayBufferAsync: the threshold between
one mini-batch and the batch, its adaptation to idle and calm steps, lending only while groups are missing and the
saving beats the switch's cost. The lending itself runs end to end in tests/trainer/test_separate_async.py; here the
training workers and the routing are recorders (no Ray)."""

from __future__ import annotations

import pytest

from verl.trainer.ppo.hybrid_switch import HybridSwitch, SwitchSettings
from verl.trainer.ppo.v1.replay_buffer import ReplayBufferAsync


class Recorder:
    """Records the calls the switch makes of the training workers and of the agent-loop manager."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.served = 0

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append(name)
            return self.served if name == "served_by" else None

        return call


def switch(ratio=0.4, parts=4, batch=16, adaptive=True, **settings) -> tuple[HybridSwitch, Recorder]:
    recorder = Recorder()
    hs = HybridSwitch(
        SwitchSettings(switch_threshold_ratio=ratio, adaptive_switch_threshold=adaptive, **settings),
        batch,
        parts,
        scaling=2.0,
        actor_wg=recorder,
        manager=recorder,
        handles=["trainer-engine-0"],
        poll_interval=0.05,
    )
    return hs, recorder


def finished(buffer: ReplayBufferAsync, count: int, step: int = 1) -> None:
    for i in range(count):
        buffer.put_prompt("train", f"p{step}-{i}", step)
        buffer.put_trajectory("train", f"p{step}-{i}", (0, i))
        buffer.set_status("train", f"p{step}-{i}", "finished")


@pytest.mark.parametrize(("ratio", "parts", "expected"), [(0.4, 4, 6), (0.1, 4, 4), (1.0, 4, 16), (0.4, 1, 16)])
def test_the_threshold_lies_between_one_mini_batch_and_the_batch(ratio, parts, expected):
    assert switch(ratio=ratio, parts=parts)[0].threshold() == expected


def test_the_ratio_rises_after_idle_steps_and_falls_after_calm_ones():
    hs, _ = switch(ratio=0.4, switch_threshold_release_steps=2, switch_threshold_step_up=0.1)
    hs.adapt(had_idle=True)
    assert hs.ratio == pytest.approx(0.4)  # one idle step: not yet
    hs.adapt(had_idle=True)
    assert hs.ratio == pytest.approx(0.5)
    hs.adapt(had_idle=False)
    hs.adapt(had_idle=False)
    assert hs.ratio == pytest.approx(0.47)  # two calm steps: down by step_down (0.03)
    for _ in range(40):
        hs.adapt(had_idle=False)
    assert hs.ratio == pytest.approx(0.25)  # never below one mini-batch (1 / parts)


def test_lends_while_groups_are_missing_and_takes_the_engines_back_once_enough_are_sampleable():
    buffer = ReplayBufferAsync(refill_fn=lambda k: None)
    hs, recorder = switch(adaptive=False)
    finished(buffer, 2)
    lend, metrics = hs.decide(buffer, global_steps=1, total_steps=3)
    assert lend and metrics["separate_async/decision/remaining"] == 4  # threshold 6, 2 sampleable
    hs.lend(version=1, timing=(timing := {}))
    assert hs.lent and recorder.calls[:2] == ["update_weights", "add_servers"] and "switch_to_rollout" in timing
    finished(buffer, 6, step=2)  # enough groups: the next step takes the engines back at once
    metrics = hs.reclaim_if_lent(buffer, global_steps=2, timing=timing)
    assert not hs.lent and recorder.calls[-4:-1] == ["remove_servers", "wait_drained", "sleep"]
    assert "switch_to_trainer" in timing and "separate_async/switch/lent_requests" in metrics
    assert hs.decide(buffer, global_steps=3, total_steps=3)[0] is False  # the last step: nothing left to lend for


def test_no_lending_when_the_saving_is_smaller_than_the_switchs_cost():
    buffer = ReplayBufferAsync(refill_fn=lambda k: None)
    hs, _ = switch(adaptive=False)
    hs._to_rollout.append(10.0), hs._to_trainer.append(10.0)  # switches measured at 20 s in all
    hs.note_sample(missing=4, seconds=4.0)  # 1 s per missing sample
    lend, metrics = hs.decide(buffer, global_steps=1, total_steps=5)
    # 6 missing × 1 s × (1 − 1/2) = 3 s saved < 20 s of switching
    assert not lend and metrics["separate_async/decision/effective_switch_cost_seconds"] == 20.0
    assert metrics["separate_async/decision/per_sample_time_seconds"] == 1.0
