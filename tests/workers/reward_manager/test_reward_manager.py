"""Reward managers: scores at the last valid token, extra info, safe scoring, DAPO's overlong penalty, registry."""

from __future__ import annotations

import logging
import math
import pickle

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.utils.reward_score.custom import FileFunction
from verl.workers.reward_manager import (
    REWARD_MANAGER_REGISTRY,
    AbstractRewardManager,
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    get_reward_manager_cls,
    register,
)
from verl.workers.reward_manager.abstract import RewardFunctionError, align_extra_info

# (question, response text, ended with EOS, ground truth)
SAMPLES = [
    ("What is 3 + 4?", "7", True, "7"),
    ("What is 5 - 1?", "3", True, "4"),
    ("What is 1 + 1?", "2abc", False, "2"),
]

USER_FUNCTIONS = """
import math

def echo(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return {"score": float(len(solution_str)), "ended": extra_info["response_ended"],
            "length": extra_info["response_length"], "bonus": kwargs.get("bonus", 0)}

def flaky(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str == "3":
        raise ValueError("cannot score " + solution_str)
    if solution_str == "2abc":
        return math.nan
    return 1.0

def batch_score(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
    return [float(s == g) + kwargs.get("bonus", 0) for s, g in zip(solution_strs, ground_truths)]

def batch_short(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
    return [1.0]

def batch_raise(data_sources, solution_strs, ground_truths, extra_infos, **kwargs):
    raise RuntimeError("service down")
"""


@pytest.fixture(scope="module")
def user_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("user") / "reward_fns.py"
    path.write_text(USER_FUNCTIONS)
    return str(path)


def expected_positions(batch: DataProto) -> list[int]:
    return (batch.batch["response_mask"].sum(-1) - 1).tolist()


class TestNaive:
    def test_default_scores_the_demo_task_at_the_last_valid_token(self, tokenizer, make_batch):
        batch = make_batch(SAMPLES)
        manager = NaiveRewardManager(tokenizer, num_examine=0, num_workers=0)
        out = manager(batch, return_dict=True)
        tensor = out["reward_tensor"]
        assert tensor.shape == (3, 8) and tensor.dtype == torch.float32
        # (arithmetic's formula) "7"+EOS right: 1.0; "3"+EOS for 4: 0.2 + 0.4·0.9 + 0.4 = 0.96;
        # "2abc" cut off: 0.2 + 0.4·1 + 0 = 0.6
        expected = [1.0, 0.96, 0.6]
        for row, (position, value) in enumerate(zip(expected_positions(batch), expected)):
            assert tensor[row, position].item() == pytest.approx(value)
            assert tensor[row].sum().item() == pytest.approx(value)  # nowhere else
        assert out["reward_extra_info"]["acc"] == [1.0, 0.0, 0.0]
        assert out["reward_metrics"] == {"reward/error_count": 0, "reward/timeout_count": 0}
        assert torch.equal(manager(batch), tensor)

    def test_a_tokenizer_with_decode_only_is_enough(self, tokenizer, make_batch):
        """veRL's managers call only ``decode``: a tokenizer-like object without ``batch_decode`` scores the same."""

        class DecodeOnly:
            eos_token_id, pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id

            def decode(self, ids, skip_special_tokens=True):
                return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

        batch = make_batch(SAMPLES)
        expected = NaiveRewardManager(tokenizer, 0, num_workers=0)(batch)
        assert torch.equal(NaiveRewardManager(DecodeOnly(), 0, num_workers=0)(batch), expected)

    def test_without_response_mask_the_attention_mask_is_used(self, tokenizer, make_batch):
        manager = NaiveRewardManager(tokenizer, 0, num_workers=0)
        with_mask = manager(make_batch(SAMPLES))
        assert torch.equal(manager(make_batch(SAMPLES, response_mask=False)), with_mask)

    def test_multi_turn_tokens_masked_out_of_response_mask_still_count(self, tokenizer, make_batch):
        """Tool tokens (response_mask 0 inside the response) are part of the response: the score goes to the last
        response token of the attention mask (veRL)."""
        manager = NaiveRewardManager(tokenizer, 0, num_workers=0)
        batch = make_batch(SAMPLES)
        expected = manager(batch)
        batch.batch["response_mask"] = batch.batch["response_mask"].clone()
        batch.batch["response_mask"][:, 0] = 0  # the first response token came from a tool
        assert torch.equal(manager(batch), expected)

    def test_the_function_sees_decoded_text_extra_info_and_kwargs(self, tokenizer, make_batch, user_file):
        fn = FileFunction(user_file, "echo")
        manager = NaiveRewardManager(tokenizer, 0, compute_score=fn, num_workers=0, bonus=5)
        info = manager(make_batch(SAMPLES), return_dict=True)["reward_extra_info"]
        assert info["score"] == [1.0, 1.0, 4.0]  # special tokens skipped: "7", "3", "2abc"
        assert info["ended"] == [True, True, False]
        assert info["length"] == [2, 2, len(tokenizer("2abc")["input_ids"])]  # "7"+EOS, "3"+EOS, "2abc" (no EOS)
        assert info["bonus"] == [5, 5, 5]

    def test_failures_score_zero_are_counted_and_logged_once(self, tokenizer, make_batch, user_file, caplog):
        manager = NaiveRewardManager(tokenizer, 0, compute_score=FileFunction(user_file, "flaky"), num_workers=1)
        batch = make_batch(SAMPLES + [("What is 5 - 1?", "3", True, "4")])
        with caplog.at_level(logging.WARNING):
            out = manager(batch, return_dict=True)
        manager.close()
        assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 0.0, 0.0]
        assert out["reward_metrics"] == {"reward/error_count": 3, "reward/timeout_count": 0}
        assert caplog.text.count("ValueError: cannot score 3") == 1  # two samples raised, one log
        assert "'score' is" not in caplog.text and "returned nan" in caplog.text

    @pytest.mark.parametrize(
        ("value", "problem"),
        [(None, "returned None"), ({"acc": 1}, "'score' is None"), (math.inf, "returned inf"), ("1", "returned '1'")],
    )
    def test_invalid_results_are_failures(self, tokenizer, make_batch, value, problem, caplog):
        def score(solution_str, **kw):  # invalid for the first sample only: a batch where all fail stops the run
            return value if solution_str == "7" else 1.0

        manager = NaiveRewardManager(tokenizer, 0, compute_score=score, num_workers=0)
        with caplog.at_level(logging.WARNING):
            out = manager(make_batch(SAMPLES[:2]), return_dict=True)
        assert out["reward_metrics"]["reward/error_count"] == 1 and out["reward_tensor"].sum(-1).tolist() == [0, 1]
        assert problem in caplog.text

    def test_timeouts_are_counted(self, tokenizer, make_batch):
        def slow(**kwargs):
            import time

            time.sleep(60 if kwargs["solution_str"] == "3" else 0)  # abandoned after the timeout (a daemon thread)
            return 1.0

        # a good call takes ~2 ms in a thread here: 5 s is ample
        manager = NaiveRewardManager(tokenizer, 0, compute_score=slow, num_workers=0, timeout_s=5)
        out = manager(make_batch(SAMPLES), return_dict=True)
        assert out["reward_metrics"] == {"reward/error_count": 0, "reward/timeout_count": 1}
        assert out["reward_tensor"].sum(-1).tolist() == [1.0, 0.0, 1.0]

    def test_examined_samples_are_logged(self, tokenizer, make_batch, caplog):
        manager = NaiveRewardManager(tokenizer, num_examine=1, num_workers=0)
        with caplog.at_level(logging.INFO, logger="verl.workers.reward_manager.abstract"):
            manager(make_batch(SAMPLES))
        assert caplog.text.count("[response]") == 1 and "What is 3 + 4?" in caplog.text

    def test_reward_model_scores_pass_through(self, tokenizer, make_batch):
        batch = make_batch(SAMPLES)
        batch.batch["rm_scores"] = torch.ones(3, 8)
        batch.non_tensor_batch["acc"] = np.array([1, 0, 1], dtype=object)
        batch.meta_info["reward_extra_keys"] = ["acc"]
        manager = NaiveRewardManager(tokenizer, 0, num_workers=0)
        out = manager(batch, return_dict=True)
        assert torch.equal(out["reward_tensor"], torch.ones(3, 8)) and out["reward_extra_info"] == {"acc": [1, 0, 1]}
        assert torch.equal(manager(batch), torch.ones(3, 8))

    def test_missing_inputs_raise(self, tokenizer, make_batch):
        manager = NaiveRewardManager(tokenizer, 0, num_workers=0)
        batch = make_batch(SAMPLES)
        batch.non_tensor_batch.pop("data_source")
        with pytest.raises(KeyError, match="data.reward_fn_key"):
            manager(batch)
        with pytest.raises(KeyError, match="responses"):
            manager(DataProto.from_dict({"input_ids": torch.zeros(1, 4)}))

    def test_rows_without_reward_model_or_extra_info(self, tokenizer, make_batch):
        batch = make_batch(SAMPLES[:1])
        batch.non_tensor_batch.pop("reward_model")
        batch.non_tensor_batch["extra_info"] = np.array([None], dtype=object)
        batch.non_tensor_batch["__num_turns__"] = np.array([2], dtype=object)
        seen = {}
        manager = NaiveRewardManager(
            tokenizer, 0, compute_score=lambda **kw: seen.update(kw) or 0.5, num_workers=0, reward_fn_key="data_source"
        )
        assert manager(batch).sum().item() == 0.5
        assert seen["ground_truth"] is None and seen["extra_info"]["num_turns"] == 2

    def test_a_manager_pickles_without_its_processes(self, tokenizer, make_batch):
        manager = NaiveRewardManager(tokenizer, 0, num_workers=0)
        clone = pickle.loads(pickle.dumps(manager))
        assert torch.equal(clone(make_batch(SAMPLES)), manager(make_batch(SAMPLES)))


class TestBatch:
    def test_one_call_for_the_batch(self, tokenizer, make_batch, user_file):
        fn = FileFunction(user_file, "batch_score")
        manager = BatchRewardManager(tokenizer, 0, compute_score=fn, num_workers=1, bonus=0.5)
        out = manager(make_batch(SAMPLES), return_dict=True)
        manager.close()
        assert out["reward_tensor"].sum(-1).tolist() == [1.5, 0.5, 0.5]
        assert out["reward_metrics"]["reward/error_count"] == 0

    @pytest.mark.parametrize(
        ("name", "message"), [("batch_short", "returned 1 values"), ("batch_raise", "RuntimeError: service down")]
    )
    def test_a_failed_batch_call_stops_the_run(self, tokenizer, make_batch, user_file, name, message, caplog):
        # the batch call fails every sample: the run must stop, naming the function, its file and the failure
        manager = BatchRewardManager(tokenizer, 0, compute_score=FileFunction(user_file, name), num_workers=0)
        with caplog.at_level(logging.WARNING), pytest.raises(RewardFunctionError) as info:
            manager(make_batch(SAMPLES), return_dict=True)
        assert f"{name} ({user_file})" in str(info.value) and "every one of the 3 samples" in str(info.value)
        assert message in str(info.value) and caplog.text.count(message) == 1

    def test_a_non_list_result_stops_the_run(self, tokenizer, make_batch):
        manager = BatchRewardManager(tokenizer, 0, compute_score=lambda **kw: 1.0, num_workers=0)
        with pytest.raises(RewardFunctionError, match="returned float; expected a list of 3"):
            manager(make_batch(SAMPLES), return_dict=True)


class TestDAPO:
    def test_overlong_penalty(self, tokenizer, make_batch):
        # max_resp_len 8, buffer 4 → expected 4; lengths 2, 2, 4 are within it; a 7-token response is 3 over:
        # penalty = −3/4 · 0.5 = −0.375
        long_sample = ("What is 1 + 1?", "2222222", False, "2")
        cfg = {"enable": True, "len": 4, "penalty_factor": 0.5, "log": True}
        manager = DAPORewardManager(
            tokenizer, 0, compute_score=lambda **kw: 1.0, max_resp_len=8, overlong_buffer_cfg=cfg, num_workers=0
        )
        out = manager(make_batch(SAMPLES + [long_sample]), return_dict=True)
        assert out["reward_tensor"].sum(-1).tolist() == [1.0, 1.0, 1.0, 0.625]
        assert out["reward_extra_info"]["overlong_reward"] == [0.0, 0.0, 0.0, -0.375]
        assert out["reward_extra_info"]["overlong"] == [False, False, False, True]
        assert out["reward_extra_info"]["acc"] == [1.0, 1.0, 1.0, 1.0]  # a float score is logged as acc

    def test_disabled_buffer_and_dict_scores(self, tokenizer, make_batch):
        manager = DAPORewardManager(tokenizer, 0, overlong_buffer_cfg={"enable": False}, num_workers=0)
        out = manager(make_batch(SAMPLES), return_dict=True)
        assert out["reward_tensor"].sum(-1).tolist() == pytest.approx([1.0, 0.96, 0.6])
        assert "overlong_reward" not in out["reward_extra_info"] and out["reward_extra_info"]["acc"] == [1.0, 0.0, 0.0]

    @pytest.mark.parametrize(
        ("max_resp_len", "length", "match"),
        [
            (None, 4, "max_resp_len"),
            (8, 0, "overlong_buffer_cfg.len"),
            (8, 9, "overlong_buffer_cfg.len"),
            (8, 2.5, "len"),
        ],
    )
    def test_buffer_config_is_validated(self, tokenizer, max_resp_len, length, match):
        with pytest.raises(ValueError, match=match) as raised:
            DAPORewardManager(
                tokenizer,
                0,
                max_resp_len=max_resp_len,
                overlong_buffer_cfg={"enable": True, "len": length},
                num_workers=0,
            )
        assert isinstance(raised.value, AssertionError)  # what veRL's constructor raises, for code catching it


class TestRegistry:
    def test_builtin_names(self):
        assert get_reward_manager_cls("naive") is NaiveRewardManager
        assert get_reward_manager_cls("batch") is BatchRewardManager
        assert get_reward_manager_cls("dapo") is DAPORewardManager

    def test_register_and_conflicts(self):
        @register("test_constant")
        class Constant(AbstractRewardManager):
            def score(self, samples):
                return self.check_results(samples, [])

        try:
            assert get_reward_manager_cls("test_constant") is Constant
            assert register("test_constant")(Constant) is Constant  # the same class again is fine
            with pytest.raises(ValueError, match="already registered"):
                register("naive")(Constant)
        finally:
            REWARD_MANAGER_REGISTRY.pop("test_constant")

    def test_unknown_name_lists_the_registered_ones(self):
        with pytest.raises(ValueError, match=r"Unknown reward manager: nope .*'naive'"):
            get_reward_manager_cls("nope")

    def test_the_base_class_has_no_scoring(self, tokenizer, make_batch):
        with pytest.raises(NotImplementedError):
            AbstractRewardManager(tokenizer, 0, num_workers=0)(make_batch(SAMPLES))


def test_extra_info_is_aligned_with_fills():
    rows = [{"score": 1.0, "acc": 1, "pred": "7"}, {}, {"score": 0.5, "pred": "3"}]
    assert align_extra_info(rows) == {"score": [1.0, 0.0, 0.5], "acc": [1, 0.0, 0.0], "pred": ["7", None, "3"]}
    assert align_extra_info([]) == {}
