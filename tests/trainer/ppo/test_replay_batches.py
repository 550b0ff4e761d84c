"""The sync mode's replay-buffer schedule (trainer.v1.sampler.schedule=replay_buffer): the real ReplayBuffer and the
trainer's real PromptStream over loader batches; the generation and scoring stages (a model, a reward function)
are replaced by a scorer whose rewards are known, so that each eviction and refill can be counted."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from tests.trainer.config.test_validate import VALID
from verl.experimental.agent_loop.failures import FAILED_COLUMN
from verl.protocol import DataProto
from verl.trainer.config.validate import ConfigError, merged, validate_config
from verl.trainer.ppo.dynamic_sampling import StepState
from verl.trainer.ppo.replay_batches import ReplayBufferBatches
from verl.trainer.ppo.rollout_source import PromptStream
from verl.utils.tracking.tables import FILTERED_REWARD_TABLE_KEY

N = 2  # samples per prompt


def config(train_batch_size: int, metric: str | None = None, inflight: int = 1, **sampler):
    cfg = OmegaConf.create(
        {
            "data": {"train_batch_size": train_batch_size},
            "algorithm": {
                "filter_groups": {"enable": metric is not None, "metric": metric, "max_inflight_gen_batches": inflight}
            },
            "trainer": {
                "v1": {
                    "sync": {},
                    "sampler": {"max_off_policy_threshold": 8, "max_off_policy_strategy": "drop", "sampler_kwargs": {}},
                }
            },
        }
    )
    return OmegaConf.merge(cfg, {"trainer": {"v1": {"sampler": sampler}}})


class Scorer:
    """Scores each prompt's N samples: all equal (an uninformative group) for the prompt indices in ``flat``."""

    def __init__(self, flat) -> None:
        self.flat, self.calls, self.epochs = set(flat), [], []

    def __call__(self, prompts: DataProto, step: StepState, first_prompt: int, epoch: int) -> DataProto:
        index = prompts.non_tensor_batch["index"]
        self.calls.append((list(index), first_prompt))
        self.epochs.append(epoch)
        rows = np.repeat(index, N)
        scores = torch.tensor([[1.0 if i in self.flat else float(k % N)] for i, k in zip(rows, range(len(rows)))])
        return DataProto.from_dict(
            {"token_level_scores": scores},
            {"uid": np.array([f"{epoch}-{i}" for i in rows], dtype=object), "index": rows},
        )


class FailingScorer(Scorer):
    """As :class:`Scorer`, and the agent loops of some samples fail (``__failed__``, as
    verl.experimental.agent_loop.failures marks them): the first sample of the prompts in ``partly``, every sample of
    those in ``wholly``."""

    def __init__(self, partly=(), wholly=()) -> None:
        super().__init__(flat=[])
        self.partly, self.wholly = set(partly), set(wholly)

    def __call__(self, prompts, step, first_prompt, epoch):
        batch = super().__call__(prompts, step, first_prompt, epoch)
        rows = batch.non_tensor_batch["index"]
        failed = [i in self.wholly or (i in self.partly and k % N == 0) for k, i in enumerate(rows)]
        batch.non_tensor_batch[FAILED_COLUMN] = np.array(failed, dtype=bool)
        return batch


def source(batch_size: int, loader_batch: int, total: int, scorer: Scorer, cfg, epochs: int = 1):
    loader = [{"index": np.arange(s, min(s + loader_batch, total))} for s in range(0, total, loader_batch)]
    state = SimpleNamespace(epoch=0)
    stream = PromptStream(loader, state, total_epochs=epochs)
    return ReplayBufferBatches(cfg, scorer, lambda: stream, lambda: state.epoch)


def trained(batch: DataProto) -> list[int]:
    return list(dict.fromkeys(int(i) for i in batch.non_tensor_batch["index"]))


def test_without_a_filter_a_step_trains_what_it_dispatched_taking_prompts_across_loader_batches():
    scorer = Scorer(flat=[])
    batches = source(4, loader_batch=6, total=12, scorer=scorer, cfg=config(4))
    firsts = [batches.next_batch(StepState(metrics={}), s) for s in (1, 2, 3)]
    assert [trained(b) for b in firsts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert [len(b) for b in firsts] == [4 * N] * 3 and [first for _, first in scorer.calls] == [0, 0, 0]
    assert batches.next_batch(StepState(metrics={}), 4) is None  # the data ran out


def test_dapo_evicts_flat_groups_refills_two_each_under_the_inflight_bound_and_discards_the_surplus():
    scorer = Scorer(flat=[0, 3, 6])
    batches = source(4, loader_batch=4, total=40, scorer=scorer, cfg=config(4, "seq_reward"))
    step = StepState(metrics={})
    batch = batches.next_batch(step, 1)
    # 0..3 dispatched, 0 and 3 evicted: credit 4 → 4..7 (numbered from 4), 6 evicted; 1, 2, 4, 5 trained, 7 left over
    assert scorer.calls == [([0, 1, 2, 3], 0), ([4, 5, 6, 7], 4)]
    assert trained(batch) == [1, 2, 4, 5] and len(batch) == 4 * N
    metrics = step.metrics
    assert metrics["training/filter_groups/evicted_samples"] == 3 and metrics["train/num_gen_batches"] == 2
    assert metrics["training/filter_groups/discarded_surplus_samples"] == 1
    assert metrics[FILTERED_REWARD_TABLE_KEY] == {1.0: 3}  # by the value the flat groups' samples share
    assert "training/off_policy/evicted_samples" not in metrics  # the sync buffer never evicts for staleness
    # step 2 starts with fresh prompts: nothing of step 1 stays in the buffer
    batch = batches.next_batch(StepState(metrics={}), 2)
    assert trained(batch) == [8, 9, 10, 11]


def test_the_inflight_bound_splits_a_large_credit():
    scorer = Scorer(flat=range(0, 4))  # the whole first batch is flat: credit 8, at most 4 prompts per refill
    batches = source(4, loader_batch=8, total=40, scorer=scorer, cfg=config(4, "seq_reward", inflight=1))
    batch = batches.next_batch(StepState(metrics={}), 1)
    assert [len(idx) for idx, _ in scorer.calls] == [4, 4] and trained(batch) == [4, 5, 6, 7]
    scorer = Scorer(flat=range(0, 4))
    batches = source(4, loader_batch=8, total=40, scorer=scorer, cfg=config(4, "seq_reward", inflight=2))
    batches.next_batch(StepState(metrics={}), 1)
    assert [len(idx) for idx, _ in scorer.calls] == [4, 8]  # the bound of 2 batches takes the whole credit at once


def test_the_prompts_left_of_a_loader_batch_survive_a_checkpoint():
    cfg = config(4, "seq_reward")
    first = source(4, loader_batch=6, total=12, scorer=Scorer(flat=[0]), cfg=cfg)
    first.next_batch(StepState(metrics={}), 1)  # 0..3, then 2 refills: 4, 5; 1..5 kept, 5 discarded
    state = first.state_dict()
    assert state["prompt_pool"]["leftover"] is None  # 0..5 were all used
    first.next_batch(StepState(metrics={}), 2)  # 6..9 from the second loader batch: 10, 11 left over
    state = first.state_dict()
    assert list(state["prompt_pool"]["leftover"].non_tensor_batch["index"]) == [10, 11]
    scorer = Scorer(flat=[])
    resumed = source(4, loader_batch=6, total=0, scorer=scorer, cfg=cfg)  # a loader that has nothing left
    resumed.load_state_dict(state)
    assert resumed.next_batch(StepState(metrics={}), 3) is None  # 10, 11 are too few for a batch
    assert scorer.calls == []


def test_a_failed_group_trains_padded_and_a_group_that_failed_wholly_is_refilled_when_asked():
    # by default (veRL's) a failed group stays: its failed samples are padded in as samples of their own group
    scorer = FailingScorer(partly=[1], wholly=[2])
    batch = source(4, loader_batch=8, total=16, scorer=scorer, cfg=config(4)).next_batch(StepState(metrics={}), 1)
    assert [len(idx) for idx, _ in scorer.calls] == [4] and len(batch) == 4 * N
    uids, failed = batch.non_tensor_batch["uid"], batch.non_tensor_batch[FAILED_COLUMN]
    assert [bool(f) for f in failed] == [False, False, True, False, True, True, False, False]
    assert [str(u) for u in uids[failed]] == ["0-1/failed-2", "0-2/failed-4", "0-2/failed-5"]
    assert len(set(uids[~failed])) == 3  # the others keep their group: 0 and 3 whole, 1 without its failed sample
    # with sync_refill_failed_groups a group with no trajectory at all is replaced (one prompt), a partial one stays
    scorer = FailingScorer(partly=[1], wholly=[2])
    step = StepState(metrics={})
    cfg = config(4, sync_refill_failed_groups=True)
    batch = source(4, loader_batch=8, total=16, scorer=scorer, cfg=cfg).next_batch(step, 1)
    assert scorer.calls == [([0, 1, 2, 3], 0), ([4], 4)] and trained(batch) == [0, 1, 3, 4]
    assert step.metrics["training/rollout_failure/evicted_samples"] == 1
    assert sum(batch.non_tensor_batch[FAILED_COLUMN]) == 1  # prompt 1's failed sample, padded in


@pytest.mark.parametrize("metric", ["acc"])
def test_a_metric_the_scores_lack_is_named(metric):
    batches = source(4, loader_batch=4, total=8, scorer=Scorer(flat=[]), cfg=config(4, metric))
    with pytest.raises(ValueError, match=r"filter_groups.metric='acc' is not a per-sample value"):
        batches.next_batch(StepState(metrics={}), 1)


USER_SAMPLER = """
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer


class CountingSampler(ReplayBuffer):
    def sample(self, global_steps, partition_id, batch_size):
        groups, metrics = super().sample(global_steps, partition_id, batch_size)
        metrics[f"training/{self.sampler_kwargs['label']}/sampled_groups"] = len(groups)
        return groups, metrics


class NotABuffer:
    pass
"""


def test_a_sampler_class_of_the_users_gets_its_kwargs_and_fills_the_step(tmp_path):
    path = tmp_path / "my_sampler.py"
    path.write_text(USER_SAMPLER)
    custom = {"path": str(path), "name": "CountingSampler"}
    cfg = config(4, custom_sampler=custom, sampler_kwargs={"label": "mine"})
    batches = source(4, loader_batch=4, total=8, scorer=Scorer(flat=[]), cfg=cfg)
    step = StepState(metrics={})
    assert trained(batches.next_batch(step, 1)) == [0, 1, 2, 3]
    assert type(batches.buffer).__name__ == "CountingSampler" and step.metrics["training/mine/sampled_groups"] == 4
    with pytest.raises(TypeError, match=r"NotABuffer is not a subclass of verl.trainer.ppo.v1.replay_buffer"):
        source(4, 4, 8, Scorer(flat=[]), config(4, custom_sampler={"path": str(path), "name": "NotABuffer"}))
    with pytest.raises(ValueError, match=r"custom_sampler \(path=.*name='Missing'\): object_name='Missing'"):
        source(4, 4, 8, Scorer(flat=[]), config(4, custom_sampler={"path": str(path), "name": "Missing"}))
    # start-up loads the class and names a bad one before anything runs
    bad = [f"trainer.v1.sampler.custom_sampler.path={path}", "trainer.v1.sampler.custom_sampler.name=NotABuffer"]
    with pytest.raises(ConfigError, match="NotABuffer is not a subclass"):
        validate_config(merged([*VALID, "trainer.v1.sampler.schedule=replay_buffer", *bad]))


def test_a_take_across_an_epochs_end_keeps_each_prompts_epoch_in_its_group_id():
    scorer = Scorer(flat=[])
    batches = source(4, loader_batch=6, total=10, scorer=scorer, cfg=config(4), epochs=2)
    got = [batches.next_batch(StepState(metrics={}), s) for s in (1, 2, 3)]
    assert [trained(b) for b in got] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    # step 3 takes 8, 9 from epoch 0's last batch and 0, 1 from epoch 1's first: two generation calls, numbered on
    assert scorer.calls[-2:] == [([8, 9], 0), ([0, 1], 2)] and scorer.epochs[-2:] == [0, 1]
    uids = list(dict.fromkeys(got[2].non_tensor_batch["uid"]))
    assert uids == ["0-8", "0-9", "1-0", "1-1"]
