"""The trainer's seams without Ray: `TrainerState` (what a checkpoint restores), `PromptStream` (epochs from the
state's position), the rollout-source registry, and `SyncRolloutSource` pulling, filtering and putting the engines
to sleep.

The data loader, the DataProto batches, the KL controller and DAPO's filter are the real ones. The trainer around
the sync source is a stand-in whose ``_rollout`` scores each prompt's two samples by a fixed rule instead of
generating: what is tested here is the source's schedule (the real generation runs in the end-to-end tests).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import get_kl_controller
from verl.trainer.ppo.dynamic_sampling import StepState, accumulate_groups
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.trainer.ppo.rollout_source import (
    PromptStream,
    Rollouter,
    RolloutSource,
    SyncRolloutSource,
    get_rollout_source_class,
    register_rollout_source,
    registered_rollout_sources,
)
from verl.trainer.ppo.trainer_state import TrainerState
from verl.utils.dataset.rl_dataset import collate_fn, create_dataloader

PROMPTS = 10


def dataloader(batch_size: int = 4):
    rows = [{"input_ids": torch.tensor([i, i + 1]), "index": i} for i in range(PROMPTS)]
    return create_dataloader(rows, batch_size=batch_size, collate_fn=collate_fn)


def indices(batch: DataProto) -> list[int]:
    return [int(i) for i in batch.non_tensor_batch["index"]]


def drain(stream: PromptStream) -> list[tuple[int, list[int]]]:
    out = []
    while (batch := stream.next()) is not None:
        out.append((stream.state.epoch, indices(batch)))
    return out


def test_prompt_stream_walks_epochs_and_resumes_from_the_state():
    state = TrainerState(dataloader=dataloader())
    stream = PromptStream(state.dataloader, state, total_epochs=2)
    # 10 prompts in batches of 4 (the last 2 dropped): 2 batches per epoch, the epoch moves when a pass ends
    first = [(indices(stream.next()), stream.state.epoch)[::-1] for _ in range(3)]
    assert first == [(0, [0, 1, 2, 3]), (0, [4, 5, 6, 7]), (1, [0, 1, 2, 3])]
    saved = state.state_dict()
    rest = drain(stream)
    assert rest == [(1, [4, 5, 6, 7])] and state.epoch == 2

    resumed = TrainerState(dataloader=dataloader())
    resumed.load_state_dict(saved)
    assert drain(PromptStream(resumed.dataloader, resumed, total_epochs=2)) == rest


def test_trainer_state_round_trip_restores_every_part():
    kl = get_kl_controller({"type": "adaptive", "kl_coef": 0.2, "target_kl": 0.1, "horizon": 100})
    state = TrainerState(global_steps=7, epoch=1, weight_version=6, kl_ctrl=kl, dataloader=dataloader())
    next(iter(state.dataloader))
    kl.update(current_kl=0.5, n_steps=8)
    random.seed(3)
    saved = state.state_dict()
    expected_draw, expected_value = random.random(), kl.value
    assert (saved["global_steps"], saved["epoch"], saved["weight_version"], saved["source"]) == (7, 1, 6, {})

    fresh = TrainerState(kl_ctrl=get_kl_controller({"type": "fixed", "kl_coef": 0.001}), dataloader=dataloader())
    fresh.load_state_dict(saved)
    assert (fresh.global_steps, fresh.epoch, fresh.weight_version) == (7, 1, 6)
    assert fresh.kl_ctrl.value == expected_value and random.random() == expected_draw
    assert indices(DataProto.from_single_dict(next(iter(fresh.dataloader)))) == [4, 5, 6, 7]

    # a checkpoint from before weight versions existed: one push per step
    old = {k: v for k, v in saved.items() if k != "weight_version"}
    fresh.load_state_dict(old)
    assert fresh.weight_version == 7


def test_a_source_without_state_refuses_a_checkpoint_that_holds_some():
    config = OmegaConf.create({"trainer": {"mode": "sync"}})
    source = SyncRolloutSource(Rollouter(config, TrainerState(), rollout=None, prompts=None, total_training_steps=1))
    source.load_state_dict({})  # nothing to restore: fine
    with pytest.raises(
        ValueError, match=r"rollout-source state \['queue'\] that trainer.v1.trainer_mode='sync' cannot restore"
    ):
        TrainerState(source=source).load_state_dict(
            {"global_steps": 1, "epoch": 0, "source": {"queue": [1]}, "rng": TrainerState().state_dict()["rng"]}
        )


def test_the_registry_names_the_modes():
    assert "sync" in registered_rollout_sources() and get_rollout_source_class("sync") is SyncRolloutSource
    with pytest.raises(
        ValueError, match="trainer.mode='nope' with .*schedule='fixed_lag' has no rollout source; .*'sync'"
    ):
        get_rollout_source_class("nope")
    assert "sync+replay_buffer" in registered_rollout_sources()  # a schedule other than the fixed lag
    assert get_rollout_source_class("sync", "replay_buffer").__name__ == "SyncReplaySource"
    with pytest.raises(ValueError, match="already has the rollout source SyncRolloutSource"):
        register_rollout_source("sync")(type("Other", (RolloutSource,), {"next_batch": lambda self, step: None}))
    with pytest.raises(TypeError, match="decorates RolloutSource subclasses"):
        register_rollout_source("x")(object)


class StandInTrainer:
    """What SyncRolloutSource uses of a trainer; ``_rollout`` scores instead of generating (see the module doc)."""

    def __init__(self, filter_groups: bool, critic_warmup: int = 0, train_batch_size: int = 4, schedule="fixed_lag"):
        sampler = {"schedule": schedule, "max_off_policy_threshold": 8, "max_off_policy_strategy": "drop"}
        self.config = OmegaConf.create(
            {
                "trainer": {"mode": "sync", "critic_warmup": critic_warmup, "v1": {"sync": {}, "sampler": sampler}},
                "data": {"train_batch_size": train_batch_size},
                "actor_rollout_ref": {"rollout": {"n": 2}},
                "algorithm": {"filter_groups": {"enable": filter_groups, "metric": "acc", "max_num_gen_batches": 0}},
            }
        )
        self.state = TrainerState(global_steps=1, dataloader=dataloader())
        self.prompts = PromptStream(self.state.dataloader, self.state, total_epochs=1)
        self.rollout_filter = functools.partial(accumulate_groups, config=self.config) if filter_groups else None
        self.slept, self.slept_in, self.stage, self.first_prompts = 0, [], None, []
        self.checkpoint_manager = SimpleNamespace(sleep_replicas=self._sleep)
        self.rollouts = []
        self.total_training_steps = 1

    def rollouter(self):
        """The seam a source gets, built by the trainer's own code over this stand-in."""
        return RayPPOTrainer._rollouter(self)

    def _sleep(self) -> None:
        self.slept += 1
        self.slept_in.append(self.stage)

    @contextlib.contextmanager
    def _stage(self, name: str, timing: dict[str, float]):
        self.stage = name
        yield
        self.stage = None

    def _updates_actor(self) -> bool:
        return self.config.trainer.critic_warmup <= self.state.global_steps

    def _rollout(
        self, prompts: DataProto, step: StepState, epoch: int | None = None, first_prompt: int | None = None
    ) -> DataProto:
        """Two samples per prompt; prompts with an odd index get one right and one wrong answer (informative)."""
        self.rollouts.append(indices(prompts))
        self.first_prompts.append(first_prompt or 0)
        rows = [i for i in indices(prompts) for _ in range(2)]
        acc = [float(j % 2) if i % 2 else 1.0 for j, i in enumerate(rows)]
        scores = torch.zeros(len(rows), 3)
        scores[:, -1] = torch.tensor(acc)
        return DataProto.from_dict(
            {"token_level_scores": scores},
            {"uid": np.array([str(i) for i in rows], dtype=object), "acc": np.array(acc, dtype=object)},
            meta_info={"reward_extra_keys": ["acc"]},
        )


def test_sync_source_returns_each_generated_batch_and_puts_the_engines_to_sleep():
    trainer = StandInTrainer(filter_groups=False)
    step = StepState(metrics={})
    batch = SyncRolloutSource(trainer.rollouter()).next_batch(step)
    assert trainer.rollouts == [[0, 1, 2, 3]] and len(batch) == 8
    assert step.metrics["training/epoch"] == 0 and trainer.slept_in == ["gen"]  # timed as gen; the push wakes them


def test_sync_source_keeps_the_engines_awake_in_a_critic_warmup_step():
    trainer = StandInTrainer(filter_groups=False, critic_warmup=2)  # step 1 updates no actor: no push follows
    SyncRolloutSource(trainer.rollouter()).next_batch(StepState(metrics={}))
    assert trainer.slept == 0


def test_the_filter_hook_asks_for_more_batches_until_the_step_is_full():
    # DAPO's filter: only odd prompts are informative, 2 per batch of 4; 4 prompts take 2 generation batches
    trainer = StandInTrainer(filter_groups=True)
    step = StepState(metrics={})
    batch = SyncRolloutSource(trainer.rollouter()).next_batch(step)
    assert trainer.rollouts == [[0, 1, 2, 3], [4, 5, 6, 7]] and trainer.slept == 1
    assert sorted(set(batch.non_tensor_batch["uid"])) == ["1", "3", "5", "7"]
    assert step.metrics["train/num_gen_batches"] == 2


def test_a_step_the_data_cannot_fill_is_not_trained_and_says_so(caplog):
    trainer = StandInTrainer(filter_groups=True, train_batch_size=6)  # 2 batches of the epoch keep 4 prompts
    with caplog.at_level(logging.WARNING, logger="verl.trainer.ppo.rollout_source"):
        assert SyncRolloutSource(trainer.rollouter()).next_batch(StepState(metrics={})) is None
    assert "the data ran out during step 1 after 2 generation batches (4 of 6 prompts kept)" in caplog.text
    assert trainer.slept == 0


def test_without_a_filter_the_replay_buffer_schedule_gives_the_fixed_lag_batches():
    """The claim of verl.trainer.ppo.replay_batches: the same prompts, seeds (prompt numbers) and rows, step by step;
    the batches differ only in order within a step, which both keep as generated."""
    got = {}
    for schedule in ("fixed_lag", "replay_buffer"):
        trainer = StandInTrainer(filter_groups=False, schedule=schedule)
        source = get_rollout_source_class("sync", schedule)(trainer.rollouter())
        batches = []
        for global_steps in (1, 2):
            trainer.state.global_steps = global_steps
            batches.append(source.next_batch(StepState(metrics={})))
        got[schedule] = (trainer.rollouts, trainer.first_prompts, trainer.slept_in, batches)
    (rollouts, firsts, slept, batches), buffered = got["fixed_lag"], got["replay_buffer"]
    assert buffered[:3] == (rollouts, firsts, slept) == ([[0, 1, 2, 3], [4, 5, 6, 7]], [0, 0], ["gen", "gen"])
    for a, b in zip(batches, buffered[3], strict=True):
        assert list(a.non_tensor_batch["uid"]) == list(b.non_tensor_batch["uid"])
        assert torch.equal(a.batch["token_level_scores"], b.batch["token_level_scores"])


def test_a_recipes_own_rollout_filter_is_refused_under_the_replay_buffer_schedule():
    trainer = StandInTrainer(filter_groups=True, schedule="replay_buffer")
    source_class = get_rollout_source_class("sync", "replay_buffer")
    source_class(trainer.rollouter())  # DAPO's own filter: the buffer does its work
    trainer.rollout_filter = lambda batch, step: batch
    with pytest.raises(ValueError, match=r"StandInTrainer._create_rollout_filter gives a rollout filter of its own"):
        source_class(trainer.rollouter())
