"""PRIME's code reward: ``prime_code.testing_util.run_test`` on real solutions in the local sandbox (passing,
wrong, crashing, not compiling, hanging), ``prime_code.compute_score``, and the ``prime`` reward manager scoring a
rollout batch of code in its scoring processes with the per-sample timeout honoured."""

from __future__ import annotations

import json
import shutil
import sys
import time

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.utils.reward_score import default_compute_score, prime_code
from verl.utils.reward_score.custom import FileFunction
from verl.utils.reward_score.prime_code.testing_util import run_test
from verl.workers.reward_manager import PrimeRewardManager, get_reward_manager_cls

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("unshare") is None, reason="needs Linux and unshare"
)

ADD = {"inputs": ["1 2\n", "3 4\n", "10 -5\n"], "outputs": ["3\n", "7\n", "5\n"]}
ADD_SOLUTION = "a, b = map(int, input().split())\nprint(a + b)"


def test_run_test_on_standard_input_problems():
    assert run_test(ADD, test=ADD_SOLUTION, timeout=2) == ([True, True, True], {})
    # wrong on the second case: checking stops there, with veRL's metadata
    results, meta = run_test(ADD, test="a, b = map(int, input().split())\nprint(a + b if a < 3 else 0)", timeout=2)
    assert results == [True, False]
    assert meta == {"output": "0\n", "expected": "7\n", "inputs": "3 4\n", "error_message": "Wrong Answer"}
    results, meta = run_test(ADD, test="print(int(input()))", timeout=2)  # ValueError on "1 2"
    assert results == [-1] and "ValueError" in meta["error"] and 'File "<string>"' in meta["traceback"]
    results, meta = run_test(ADD, test="print(", timeout=2)
    assert results == [-2] and "SyntaxError" in meta["error"]
    # whitespace and float tolerance, as APPS compares
    floats = {"inputs": ["x"], "outputs": ["0.3333333 \n\n"]}
    assert run_test(floats, test="print(1/3)", timeout=2)[0] == [True]
    assert run_test(floats, test="print(0.34)", timeout=2)[0] == [False]


def test_run_test_on_call_based_problems():
    two_sum = {"fn_name": "add", "inputs": ["1\n2", "[1, 2]\n[3]"], "outputs": ["3", "[1, 2, 3]"]}
    assert run_test(two_sum, test="def add(a, b):\n    return a + b", timeout=2) == ([True, True], {})
    solution = "class Solution:\n    def add(self, a, b):\n        return a + b"
    assert run_test(two_sum, test=solution, timeout=2) == ([True, True], {})
    missing = {**two_sum, "fn_name": "combine"}
    results, meta = run_test(missing, test="def plus(a, b):\n    return a + b", timeout=2)
    assert results == [-2] and "KeyError" in meta["error"]  # no function named combine


def test_a_hanging_case_is_cut_at_the_timeout():
    start = time.monotonic()
    results, meta = run_test(ADD, test="import time\nwhile True:\n    pass", timeout=1)
    elapsed = time.monotonic() - start
    assert results == [-1] and "time limit exceeded" in meta["error"]
    assert elapsed < 3, elapsed
    # a solution that swallows the alarm is still stopped, by the global limit: every case counts as failed
    start = time.monotonic()
    swallow = "while True:\n    try:\n        while True:\n            pass\n    except BaseException:\n        pass"
    results, meta = run_test({"inputs": ["1"], "outputs": ["1"]}, test=swallow, timeout=0.5)
    assert results == [-1] and "no result" in meta["error"]
    assert time.monotonic() - start < 4


def test_run_test_refuses_malformed_arguments():
    with pytest.raises(ValueError, match="needs the code"):
        run_test(ADD)
    with pytest.raises(ValueError, match="2 inputs but 1 outputs"):
        run_test({"inputs": ["1", "2"], "outputs": ["1"]}, test="print(1)")
    with pytest.raises(ValueError, match="needs in_outs with 'inputs' and 'outputs'"):
        run_test({"inputs": []}, test="print(1)")
    with pytest.raises(ValueError, match="timeout must be a positive number"):
        run_test(ADD, test="print(1)", timeout=0)


def test_compute_score_all_cases_then_per_case_fraction():
    completion = f"Here is my code:\n```python\n{ADD_SOLUTION}\n```"
    success, meta = prime_code.compute_score(completion, json.dumps(ADD))
    assert success is True and meta == {}
    half_right = "```python\na, b = map(int, input().split())\nprint(a + b if a < 3 else 0)\n```"
    assert prime_code.compute_score(half_right, ADD)[0] is False
    fraction, metas = prime_code.compute_score(half_right, ADD, continuous=True)
    assert fraction == pytest.approx(1 / 3)  # only the first case has a < 3
    assert [m["test_case"]["res"] for m in metas] == ["[True]", "[False]", "[False]"]
    assert prime_code.compute_score("x", "not json")[0] is False
    assert default_compute_score("codecontests", completion, json.dumps(ADD)) == 1.0


def test_veRLs_module_level_helpers_score_lists_of_completions():
    """veRL's ``prime.parallel_compute_score_async`` (scoring processes; a failing call scores 0) and
    ``prime_code.apps_check_correctness``."""
    import asyncio

    from verl.workers.reward_manager.prime import parallel_compute_score_async, run_reward_scoring

    completions = [f"```python\n{ADD_SOLUTION}\n```", "```python\nprint(0)\n```", "anything"]
    tasks = ["codecontests", "codecontests", "no_such_source"]  # the last has no scorer: it scores 0
    truths = [json.dumps(ADD)] * 3
    scores = asyncio.run(
        parallel_compute_score_async(default_compute_score, completions, truths, tasks, num_processes=2)
    )
    assert scores == [1.0, 0.0, 0.0] and run_reward_scoring(default_compute_score, completions, truths, tasks) == scores
    assert prime_code.apps_check_correctness(in_outs=ADD, generation=ADD_SOLUTION, timeout=2)[0] == [True] * 3


def _code_batch(tokenizer, solutions: list[str], ground_truths: list[str], data_source: str) -> DataProto:
    """A rollout batch whose responses are ``solutions`` (right-padded, EOS-ended) after a one-token prompt."""
    ids = [tokenizer(s, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for s in solutions]
    width = max(len(x) for x in ids)
    responses = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x in ids])
    prompts = torch.full((len(ids), 1), tokenizer.eos_token_id)
    valid = torch.arange(width) < torch.tensor([len(x) for x in ids])[:, None]
    attention = torch.cat([torch.ones_like(prompts), valid.long()], dim=1)
    tensors = {"prompts": prompts, "responses": responses, "attention_mask": attention}
    non_tensors = {
        "data_source": np.array([data_source] * len(ids), dtype=object),
        "reward_model": np.array([{"ground_truth": g} for g in ground_truths], dtype=object),
        "extra_info": np.array([{"index": i} for i in range(len(ids))], dtype=object),
    }
    return DataProto.from_dict(tensors, non_tensors)


USER_FILE = """import time

from verl.utils.reward_score import default_compute_score, prime_code


def slow_on_hang(data_source, solution_str, ground_truth, extra_info=None):
    # veRL's positional reward signature; a response saying "hang" never returns
    if "hang" in solution_str:
        time.sleep(60)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)


def prime_tuple_score(data_source, solution_str, ground_truth, extra_info=None):
    # prime_code's own (success, metadata) result, as PRIME's recipes return it
    return prime_code.compute_score(solution_str, ground_truth)
"""


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "code_reward.py"
    path.write_text(USER_FILE)
    return path


def test_prime_reward_manager_scores_code_in_parallel_with_a_timeout(tokenizer, user_file):
    assert get_reward_manager_cls("prime") is PrimeRewardManager
    cases = json.dumps(ADD)
    solutions = [ADD_SOLUTION, "print(0)", "print(", "# hang\nprint(1)"]
    batch = _code_batch(tokenizer, solutions, [cases] * 4, "codecontests")
    scorer = FileFunction(user_file, "slow_on_hang")
    manager = PrimeRewardManager(tokenizer, 0, compute_score=scorer, timeout_s=3, num_workers=2)
    try:
        start = time.monotonic()
        out = manager(batch, return_dict=True)
        elapsed = time.monotonic() - start
    finally:
        manager.close()
    tensor = out["reward_tensor"]
    lengths = batch.batch["attention_mask"][:, 1:].sum(-1)
    scores = [tensor[i, lengths[i] - 1].item() for i in range(4)]
    assert scores == [1.0, 0.0, 0.0, 0.0]
    assert tensor.sum().item() == 1.0  # only at the last valid token
    assert batch.batch["acc"].tolist() == scores  # what PRIME's implicit reward model reads
    assert out["reward_metrics"] == {"reward/error_count": 0, "reward/timeout_count": 1}
    assert elapsed < 10, elapsed  # the hang was cut at 3 s while the other process scored the rest


def test_verify_returns_the_scores_and_a_tuple_scores_its_first_element(tokenizer, user_file):
    batch = _code_batch(tokenizer, [ADD_SOLUTION, "print(1)"], [json.dumps(ADD)] * 2, "codecontests")
    scorer = FileFunction(user_file, "prime_tuple_score")
    manager = PrimeRewardManager(tokenizer, 0, compute_score=scorer, num_workers=1, timeout_s=20)
    try:
        assert manager.verify(batch) == [1.0, 0.0]
    finally:
        manager.close()
