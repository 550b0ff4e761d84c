"""A veRL user's reward files under every reward manager, built from config keys the way the trainer builds them.

The functions below are written to veRL's documented signatures, without ``**kwargs``: each manager must give them
only what they declare, ``reward_kwargs`` must reach them (``custom_reward_function.reward_kwargs`` and
``reward_model.reward_kwargs``), an undeclared key must fail at start-up, and a function that fails on every sample
must stop the run while sporadic failures are only counted.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl.trainer.config.validate import merged
from verl.trainer.ppo.reward import load_reward_manager
from verl.workers.reward_manager import REWARD_MANAGER_REGISTRY, AbstractRewardManager, register
from verl.workers.reward_manager.abstract import RewardFunctionError

SAMPLES = [
    ("What is 3 + 4?", "7", True, "7"),
    ("What is 5 - 1?", "3", True, "4"),
    ("What is 1 + 1?", "2abc", False, "2"),
]

REWARD_FILE = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str == ground_truth)

def scaled(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    return scale * float(solution_str == ground_truth)

def no_extra_info(data_source, solution_str, ground_truth):
    return len(solution_str) / 100

def batch_score(data_sources, solution_strs, ground_truths, extra_infos):
    return [float(s == g) for s, g in zip(solution_strs, ground_truths)]

def always_raises(data_source, solution_str, ground_truth, extra_info=None):
    raise ValueError("no parser for " + repr(solution_str))

def sometimes_raises(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "3":
        raise ValueError("cannot score 3")
    return 1.0
"""


@pytest.fixture(scope="module")
def reward_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("user") / "my_reward.py"
    path.write_text(REWARD_FILE)
    return str(path)


def build(tokenizer, reward_file: str, name: str, *overrides: str, **reward_kwargs):
    """The manager the trainer builds from ``custom_reward_function.path=<file> .name=<name> <overrides>``."""
    cfg = merged([f"custom_reward_function.path={reward_file}", f"custom_reward_function.name={name}", *overrides])
    cfg.reward_model.num_workers = 0  # score in threads: these tests are about arguments, not processes
    return load_reward_manager(
        OmegaConf.create(OmegaConf.to_container(cfg, resolve=True)), tokenizer, 0, **reward_kwargs
    )


def scores(manager, batch) -> tuple[list[float], dict]:
    out = manager(batch, return_dict=True)
    return out["reward_tensor"].sum(-1).tolist(), out["reward_metrics"]


@pytest.mark.parametrize("manager_name", ["naive", "dapo"])
def test_veRL_signature_scores_under_the_per_sample_managers(tokenizer, make_batch, reward_file, manager_name):
    overlong = ["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=4"]
    extra = overlong if manager_name == "dapo" else []
    manager = build(tokenizer, reward_file, "compute_score", f"reward_manager.name={manager_name}", *extra)
    values, metrics = scores(manager, make_batch(SAMPLES))
    assert metrics == {"reward/error_count": 0, "reward/timeout_count": 0}
    if manager_name == "naive":
        assert values == [1.0, 0.0, 0.0]
    else:  # data.max_response_length=512, buffer 4: short responses get no overlong penalty
        assert values == [1.0, 0.0, 0.0] and manager.max_resp_len == 512


def test_a_function_without_extra_info_gets_only_what_it_declares(tokenizer, make_batch, reward_file):
    values, metrics = scores(build(tokenizer, reward_file, "no_extra_info"), make_batch(SAMPLES))
    assert metrics["reward/error_count"] == 0 and values == pytest.approx([0.01, 0.01, 0.04])


def test_veRL_batch_signature(tokenizer, make_batch, reward_file):
    manager = build(tokenizer, reward_file, "batch_score", "reward_manager.name=batch")
    assert scores(manager, make_batch(SAMPLES))[0] == [1.0, 0.0, 0.0]


def test_reward_kwargs_reach_the_function_from_both_keys(tokenizer, make_batch, reward_file):
    via_custom = build(tokenizer, reward_file, "scaled", "custom_reward_function.reward_kwargs.scale=3")
    assert scores(via_custom, make_batch(SAMPLES))[0] == [3.0, 0.0, 0.0]
    # `+reward_model.reward_kwargs.scale=2`: the trainer passes them to load_reward_manager as keywords
    via_reward_model = build(tokenizer, reward_file, "scaled", scale=2.0)
    assert scores(via_reward_model, make_batch(SAMPLES))[0] == [2.0, 0.0, 0.0]


def test_an_undeclared_reward_kwarg_fails_at_start_up(tokenizer, reward_file):
    with pytest.raises(TypeError, match=r"\['bonus'\].*compute_score .*my_reward.py"):
        build(tokenizer, reward_file, "compute_score", "custom_reward_function.reward_kwargs.bonus=1")
    with pytest.raises(TypeError, match=r"\['bonus'\] \(reward.reward_kwargs\).*compute_score"):
        build(tokenizer, reward_file, "compute_score", bonus=1)


def test_a_registered_manager_with_veRL_constructor(tokenizer, make_batch, reward_file):
    @register("carry_over_counting")
    class CountingManager(AbstractRewardManager):  # veRL's constructor arguments, nothing else
        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source"):
            super().__init__(tokenizer, num_examine, compute_score, reward_fn_key, num_workers=0)

        def score(self, samples):
            return self.run_per_sample(samples)

    try:
        manager = build(tokenizer, reward_file, "compute_score", "reward_manager.name=carry_over_counting")
        assert type(manager) is CountingManager and scores(manager, make_batch(SAMPLES))[0] == [1.0, 0.0, 0.0]
        with pytest.raises(TypeError, match=r"reward.reward_kwargs \['scale'\].*CountingManager"):
            build(tokenizer, reward_file, "compute_score", "reward_manager.name=carry_over_counting", scale=2.0)
    finally:
        REWARD_MANAGER_REGISTRY.pop("carry_over_counting")


@pytest.mark.parametrize("manager_name", ["naive", "dapo"])
def test_a_function_failing_on_every_sample_stops_the_run(tokenizer, make_batch, reward_file, manager_name):
    manager = build(tokenizer, reward_file, "always_raises", f"reward_manager.name={manager_name}")
    with pytest.raises(RewardFunctionError) as info:
        manager(make_batch(SAMPLES))
    message = str(info.value)
    assert f"always_raises ({reward_file})" in message and "every one of the 3 samples" in message
    assert "ValueError: no parser for '7'" in message  # the first failure, with its traceback


def test_sporadic_failures_are_counted(tokenizer, make_batch, reward_file):
    values, metrics = scores(build(tokenizer, reward_file, "sometimes_raises"), make_batch(SAMPLES))
    assert values == [1.0, 0.0, 1.0] and metrics == {"reward/error_count": 1, "reward/timeout_count": 0}
