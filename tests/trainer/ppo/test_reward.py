"""verl.trainer.ppo.reward: the reward function built from the config, and compute_reward on a batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.config.errors import ConfigError
from verl.trainer.ppo.reward import (
    DEFAULT_REWARD_TIMEOUT_S,
    compute_reward,
    compute_reward_with_metrics,
    get_custom_reward_fn,
    load_reward_manager,
)
from verl.utils.demo import build_demo_tokenizer
from verl.utils.reward_score.custom import FileFunction
from verl.workers.reward_manager import DAPORewardManager, NaiveRewardManager

USER_FILE = """
from verl.workers.reward_manager import NaiveRewardManager

def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0, **kwargs):
    return {"score": scale * float(solution_str.strip() == ground_truth), "seen_scale": scale}

class MyManager(NaiveRewardManager):
    pass

class Minimal:  # a manager that takes none of the optional keywords
    def __init__(self, tokenizer, num_examine, compute_score, reward_fn_key):
        self.compute_score = compute_score

    def __call__(self, data, return_dict=False):
        tensor = torch.zeros(len(data), 1)
        return {"reward_tensor": tensor} if return_dict else tensor

import torch
not_a_class = 1
"""


@pytest.fixture(scope="module")
def tokenizer():
    return build_demo_tokenizer()


@pytest.fixture(scope="module")
def user_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("user") / "my_reward.py"
    path.write_text(USER_FILE)
    return str(path)


def config(**sections):
    return OmegaConf.create(sections)


def batch(tokenizer, responses: list[str], truths: list[str]) -> DataProto:
    """Prompts of 4 tokens, responses of 4 tokens (text + EOS, right-padded)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows = [(tokenizer(r, add_special_tokens=False)["input_ids"] + [eos])[:4] for r in responses]
    resp = torch.tensor([r + [pad] * (4 - len(r)) for r in rows])
    prompts = torch.full((len(rows), 4), tokenizer.convert_tokens_to_ids("a"))
    mask = torch.cat([torch.ones(len(rows), 4, dtype=torch.long), (resp != pad).long()], dim=1)
    return DataProto.from_dict(
        {"prompts": prompts, "responses": resp, "attention_mask": mask},
        {
            "data_source": np.array(["verl/arithmetic"] * len(rows), dtype=object),
            "reward_model": np.array([{"ground_truth": t} for t in truths], dtype=object),
        },
    )


class TestCustomRewardFn:
    def test_none_without_a_path(self):
        assert get_custom_reward_fn(config()) is None
        assert get_custom_reward_fn(config(custom_reward_function={"path": None, "name": "compute_score"})) is None
        assert get_custom_reward_fn(None) is None

    def test_loads_the_function_with_its_kwargs(self, user_file):
        cfg = config(custom_reward_function={"path": user_file, "name": "compute_score", "reward_kwargs": {"scale": 2}})
        fn = get_custom_reward_fn(cfg)
        assert isinstance(fn, FileFunction)
        assert fn("d", "7", "7", scale=100) == {"score": 2.0, "seen_scale": 2}  # reward_kwargs win
        assert get_custom_reward_fn(config(custom_reward_function={"path": user_file}))("d", "7", "7")["score"] == 1.0

    def test_bad_path_or_name_fails_at_start_up(self, user_file, tmp_path):
        with pytest.raises(FileNotFoundError, match="custom_reward_function.path"):
            get_custom_reward_fn(config(custom_reward_function={"path": str(tmp_path / "nope.py")}))
        with pytest.raises(AttributeError, match="custom_reward_function.name"):
            get_custom_reward_fn(config(custom_reward_function={"path": user_file, "name": "missing"}))


class TestLoadRewardManager:
    def test_defaults(self, tokenizer):
        manager = load_reward_manager(config(), tokenizer, num_examine=1)
        assert type(manager) is NaiveRewardManager
        assert manager.timeout_s == DEFAULT_REWARD_TIMEOUT_S == 30.0 and manager.num_workers == 1
        assert manager.reward_fn_key == "data_source" and manager.num_examine == 1
        assert manager.compute_score.__name__ == "default_compute_score"

    def test_reads_reward_model_and_data_keys(self, tokenizer, user_file):
        cfg = config(
            reward_manager={"source": "register", "name": "dapo"},
            reward_model={
                "timeout_s": 5,
                "num_workers": 0,
                "overlong_buffer": {"enable": True, "len": 2, "penalty_factor": 1.0, "log": False},
            },
            data={"reward_fn_key": "source", "max_response_length": 16},
            custom_reward_function={"path": user_file, "reward_kwargs": {"scale": 3}},
        )
        manager = load_reward_manager(cfg, tokenizer, 0, extra_kwarg=7)
        assert type(manager) is DAPORewardManager
        assert (manager.timeout_s, manager.num_workers, manager.max_resp_len) == (5, 0, 16)
        assert manager.overlong_buffer_cfg == {"enable": True, "len": 2, "penalty_factor": 1.0, "log": False}
        assert type(manager.overlong_buffer_cfg) is dict and manager.reward_fn_key == "source"
        assert manager.reward_kwargs == {"extra_kwarg": 7} and manager.compute_score.kwargs == {"scale": 3}
        assert type(manager.compute_score.kwargs) is dict

    def test_older_names_are_read_into_reward_and_conflicts_are_refused(self, tokenizer):
        assert (
            type(load_reward_manager(config(reward_model={"reward_manager": "dapo"}), tokenizer, 0))
            is DAPORewardManager
        )
        cfg = config(reward_manager={"name": "naive"}, reward_model={"reward_manager": "dapo"})
        with pytest.raises(ConfigError, match="reward_manager.name='naive' and reward.reward_manager.name='dapo'"):
            load_reward_manager(cfg, tokenizer, 0)  # two older names of one setting, given two values
        cfg = config(reward={"reward_manager": {"name": "batch"}}, reward_model={"reward_manager": "dapo"})
        with pytest.raises(ConfigError, match="reward_model.reward_manager='dapo' and reward.reward_manager.name"):
            load_reward_manager(cfg, tokenizer, 0)
        assert type(load_reward_manager(config(reward={"reward_manager": {"name": "dapo"}}), tokenizer)) is (
            DAPORewardManager
        )

    def test_explicit_kwargs_win_over_the_config(self, tokenizer):
        manager = load_reward_manager(config(reward_model={"timeout_s": 5}), tokenizer, 0, timeout_s=1)
        assert manager.timeout_s == 1

    def test_importlib_source(self, tokenizer, user_file):
        cfg = config(reward_manager={"source": "importlib", "name": "MyManager", "module": {"path": user_file}})
        assert type(load_reward_manager(cfg, tokenizer, 0)).__name__ == "MyManager"
        cfg = config(
            reward_manager={"source": "importlib", "name": "x", "module": {"path": user_file, "name": "Minimal"}}
        )
        minimal = load_reward_manager(cfg, tokenizer, 0)  # optional keywords not passed to a class without them
        assert type(minimal).__name__ == "Minimal"

    @pytest.mark.parametrize(
        ("reward_manager", "error", "match"),
        [
            ({"source": "importlib", "name": "MyManager"}, ValueError, "reward_manager.module.path"),
            ({"source": "importlib", "name": "not_a_class", "module": {"path": "USER"}}, TypeError, "not a class"),
            ({"source": "pypi"}, ValueError, "reward_manager.source"),
            ({"name": "nope"}, ValueError, "Unknown reward manager: nope "),
        ],
    )
    def test_bad_manager_configs(self, tokenizer, user_file, reward_manager, error, match):
        if "module" in reward_manager:
            reward_manager["module"]["path"] = user_file
        with pytest.raises(error, match=match):
            load_reward_manager(config(reward_manager=reward_manager), tokenizer, 0)


class TestComputeReward:
    def test_tensor_and_extra_info(self, tokenizer):
        manager = load_reward_manager(config(reward_model={"num_workers": 1}), tokenizer, 0)
        data = batch(tokenizer, ["7", "5"], ["7", "6"])
        reward_tensor, extra = compute_reward(data, manager)
        assert reward_tensor[:, 1].tolist() == pytest.approx([1.0, 0.96])  # "7"/"5" + EOS: last token at 1
        assert extra["acc"] == [1.0, 0.0]
        _, _, metrics = compute_reward_with_metrics(data, manager)
        assert metrics == {"reward/error_count": 0, "reward/timeout_count": 0}
        manager.close()

    def test_a_reward_fn_that_returns_a_bare_tensor(self, tokenizer):
        def reward_fn(data, return_dict=False):
            return torch.ones(len(data), 4)

        tensor, extra, metrics = compute_reward_with_metrics(batch(tokenizer, ["1"], ["1"]), reward_fn)
        assert tensor.shape == (1, 4) and extra == {} and metrics == {}

    def test_a_manager_without_metrics(self, tokenizer, user_file):
        cfg = config(reward_manager={"source": "importlib", "name": "Minimal", "module": {"path": user_file}})
        tensor, extra, metrics = compute_reward_with_metrics(
            batch(tokenizer, ["1"], ["1"]), load_reward_manager(cfg, tokenizer, 0)
        )
        assert tensor.shape == (1, 1) and extra == {} and metrics == {}
