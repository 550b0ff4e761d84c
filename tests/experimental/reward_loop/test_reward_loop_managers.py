"""veRL 0.10's reward-loop managers: the contract, rate limits counted per window, scoring in other processes, a
user's manager by path, failures counted and a judge that fails everywhere stopping the run."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import torch
from omegaconf import OmegaConf

from tests.trainer.ppo.test_reward import batch
from verl.experimental.reward_loop.rate_limits import AsyncTokenBucket, RateLimits, RateLimitSettings, TokenBucket
from verl.experimental.reward_loop.reward_fn import RewardLoopFunction
from verl.experimental.reward_loop.reward_manager import (
    REWARD_MANAGER,
    NaiveRewardManager,
    RateLimitedRewardManager,
    RemoteRewardManager,
    RewardManagerBase,
    get_reward_manager_cls,
)
from verl.trainer.ppo.reward import load_reward_manager
from verl.utils.demo import build_demo_tokenizer
from verl.workers.reward_manager.abstract import RewardFunctionError

# veRL's signature; the judge-like functions report when they ran and in which process
USER_FILE = """
import asyncio, os, time

CALLS = []

def exact(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == ground_truth)

def where(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": float(solution_str.strip() == ground_truth), "pid": os.getpid()}

async def judge(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0.05)  # the judge's latency
    return {"score": float(solution_str.strip() == ground_truth), "t": time.monotonic()}

async def slow_judge(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(5)
    return 1.0

def broken(data_source, solution_str, ground_truth, extra_info=None):
    raise ConnectionError("judge unreachable")

from verl.experimental.reward_loop.reward_manager import RewardManagerBase

class LengthManager(RewardManagerBase):
    async def run_single(self, data):
        inputs = self.sample(data)
        return {"reward_score": float(inputs.valid_response_length), "reward_extra_info": {"seen": 1}}
"""


@pytest.fixture(scope="module")
def tokenizer():
    return build_demo_tokenizer()


@pytest.fixture(scope="module")
def user_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("user") / "judges.py"
    path.write_text(USER_FILE)
    return str(path)


def reward_config(user_file: str | None, name: str = "naive", function: str = "exact", **reward):
    section = {"reward_manager": {"source": "register", "name": name}, **reward}
    if user_file:
        section["custom_reward_function"] = {"path": user_file, "name": function}
    return OmegaConf.create({"reward": section, "data": {"reward_fn_key": "data_source"}})


RESPONSES, TRUTHS = ["7", "3", "12", "5"], ["7", "4", "12", "6"]


def test_the_registry_and_the_batch_backed_managers_score_as_the_batch_managers(tokenizer, user_file):
    assert {"naive", "dapo", "gdpo", "rate_limited", "remote"} <= set(REWARD_MANAGER)
    assert get_reward_manager_cls("naive") is NaiveRewardManager
    with pytest.raises(ValueError, match="Unknown reward-loop manager: nope"):
        get_reward_manager_cls("nope")
    data = batch(tokenizer, RESPONSES, TRUTHS)
    config = reward_config(user_file)
    expected = load_reward_manager(config, tokenizer)(data, return_dict=True)  # the batch manager
    fn = load_reward_manager(config, tokenizer, manager_cls=NaiveRewardManager)  # veRL's reward-loop class
    assert isinstance(fn, RewardLoopFunction) and isinstance(fn.manager, RewardManagerBase)
    got = fn(data, return_dict=True)
    assert torch.equal(got["reward_tensor"], expected["reward_tensor"])
    assert got["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    assert got["reward_extra_info"]["acc"] == [1.0, 0.0, 1.0, 0.0]  # a number is also acc (veRL's rule)
    one = asyncio.run(fn.manager.run_single(data[0:1]))
    assert one == {"reward_score": 1.0, "reward_extra_info": {"acc": 1.0}}
    # veRL's module paths, and the dapo manager's overlong settings read from reward.reward_kwargs
    from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

    buffer = {"enable": True, "len": 2, "penalty_factor": 1.0, "log": False}
    config.reward.reward_kwargs = {"overlong_buffer_cfg": buffer, "max_resp_len": 4}
    dapo = DAPORewardManager(config=config, tokenizer=tokenizer)
    assert get_reward_manager_cls("dapo") is DAPORewardManager and dapo.max_resp_len == 4
    assert dapo.overlong_buffer_cfg["len"] == 2


def test_a_users_reward_loop_manager_by_path_and_a_judge_that_always_fails(tokenizer, user_file):
    data = batch(tokenizer, RESPONSES, TRUTHS)
    config = reward_config(None)
    config.reward.reward_manager = {"source": "importlib", "module": {"path": user_file, "name": "LengthManager"}}
    fn = load_reward_manager(config, tokenizer)
    out = fn(data, return_dict=True)
    lengths = data.batch["attention_mask"][:, 4:].sum(-1)
    assert out["reward_tensor"].sum(-1).tolist() == lengths.float().tolist()
    assert out["reward_tensor"][0, int(lengths[0]) - 1] == lengths[0]  # at the last valid token
    assert out["reward_extra_info"]["seen"] == [1] * 4 and out["reward_metrics"]["reward/error_count"] == 0

    class Limited(RateLimitedRewardManager):  # limits of its own (the first instance in a process fixes them)
        pass

    config = reward_config(user_file, "rate_limited", "broken", max_concurrent=4)
    broken = load_reward_manager(config, tokenizer, manager_cls=Limited)
    with pytest.raises(RewardFunctionError, match="Limited failed on every one of the 4 samples"):
        broken(data)


def test_token_bucket_reserves_in_arrival_order_at_the_rate():
    now = [0.0]
    bucket = TokenBucket(10.0, clock=lambda: now[0])  # 10 a second, 10 at once
    waits = [bucket.reserve(1.0) for _ in range(13)]
    assert waits[:10] == [0.0] * 10 and waits[10:] == pytest.approx([0.1, 0.2, 0.3])
    now[0] = 1.0  # a second later the balance (−3) has refilled to 7
    assert bucket.reserve(7.0) == 0.0 and bucket.reserve(1.0) == pytest.approx(0.1)
    veRL = AsyncTokenBucket(rate_limit=10.0, max_tokens=20.0)  # veRL 0.10's awaited bucket over the same one
    assert veRL.tokens == 20.0 and veRL.last_update is None
    asyncio.run(veRL.acquire(5.0))
    assert veRL.tokens == pytest.approx(15.0) and veRL.last_update is not None


def test_rate_limits_grant_no_more_than_the_rate_allows_per_window():
    limits = RateLimits(RateLimitSettings(max_concurrent=3, max_rpm=1200))  # 20 a second, a burst of 20

    async def one() -> None:
        await limits.acquire()
        try:
            await asyncio.sleep(0.01)  # the call
        finally:
            limits.release()

    async def all_of_them() -> float:
        start = time.monotonic()
        await asyncio.gather(*(one() for _ in range(40)))
        return time.monotonic() - start

    elapsed = asyncio.run(all_of_them())
    granted = sorted(limits.granted)
    assert len(granted) == 40 and limits.max_in_flight <= 3
    for i, t in enumerate(granted):  # any window of w seconds holds at most 20·(1 + w) grants
        for w in (0.25, 0.5, 1.0):
            assert sum(t <= u < t + w for u in granted[i:]) <= 20 * (1 + w) + 1
    assert elapsed >= (40 - 20) / 20 * 0.9  # the 20 beyond the burst waited for the refill


def test_rate_limited_manager_under_ray_shares_one_limit_and_times_out(ray_cluster, tokenizer, user_file):
    data = batch(tokenizer, RESPONSES * 3, TRUTHS * 3)

    class Judge(RateLimitedRewardManager):  # limits of its own (the first instance in a process fixes them)
        pass

    config = reward_config(user_file, "rate_limited", "judge", max_concurrent=2, max_rpm=1500, timeout=10)
    train = load_reward_manager(config, tokenizer, manager_cls=Judge)
    val = load_reward_manager(config, tokenizer, manager_cls=Judge)
    out = train(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0] * 3
    val(data[:4])
    stats = asyncio.run(train.manager.limits.stats())  # one actor for both managers (the run's limits)
    assert len(stats["granted"]) == 16 and stats["max_in_flight"] <= 2
    assert stats["settings"]["max_rpm"] == 1500

    slow_config = reward_config(user_file, "rate_limited", "slow_judge", max_concurrent=4, timeout=0.2)
    slow = load_reward_manager(slow_config, tokenizer, manager_cls=Judge)  # the timeout is the instance's
    with pytest.raises(RewardFunctionError, match="4 timed out"):
        slow(data[:4])
    scores = asyncio.run(slow.score_row(data[0:1]))
    assert scores.timed_out and scores.extra == {"timeout": True, "acc": 0.0}


def test_remote_manager_scores_in_its_worker_processes(ray_cluster, tokenizer, user_file):
    data = batch(tokenizer, RESPONSES, TRUTHS)
    fn = load_reward_manager(reward_config(user_file, "remote", "where", num_workers=2), tokenizer)
    assert isinstance(fn.manager, RemoteRewardManager) and len(fn.manager.workers) == 2
    out = fn(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0, 0.0]
    pids = set(out["reward_extra_info"]["pid"])
    assert len(pids) == 2 and os.getpid() not in pids  # round-robin over two other processes


def test_rate_limited_refuses_nothing_silently(tokenizer, user_file):
    assert issubclass(RateLimitedRewardManager, RewardManagerBase)
    with pytest.raises(ValueError, match=r"reward.max_rpm=0 must be positive"):
        RateLimitSettings.from_config({"max_rpm": 0})
