"""RewardScorePool: a raising, hanging or crashing reward function costs one sample, and the run goes on."""

from __future__ import annotations

import logging
import os
import pickle
import textwrap
import time

import pytest

from verl.utils.reward_score import pool as pool_module
from verl.utils.reward_score.custom import FileFunction, load_function_from_file
from verl.utils.reward_score.pool import FailureLog, RewardScorePool, ScoreResult

USER_FUNCTIONS = """
import asyncio, os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str == "raise":
        raise ValueError("bad sample " + ground_truth)
    if solution_str == "hang":
        time.sleep(3600)
    if solution_str == "exit":
        os._exit(3)
    if solution_str == "kwargs":
        return kwargs
    return float(solution_str == ground_truth)

async def async_score(data_source, solution_str, ground_truth, extra_info=None):
    await asyncio.sleep(0)
    return {"score": 0.5, "acc": 1.0}

not_callable = 3
"""


@pytest.fixture(scope="module")
def user_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("user") / "my_reward.py"
    path.write_text(USER_FUNCTIONS)
    return str(path)


# A call's time limit counts from its dispatch, so a call given to a freshly started process pays for its start:
# measured 0.45-0.65 s here (2 busy cores) for the slowest good call; 8 s leaves the good calls ≥ 12× that.
PROCESS_TIMEOUT_S = 8.0


@pytest.fixture(scope="module")
def process_pool(user_file):
    with RewardScorePool(FileFunction(user_file, "compute_score"), num_workers=2, timeout_s=PROCESS_TIMEOUT_S) as pool:
        yield pool


def calls(*answers: str, truth: str = "1") -> list:
    return [((), {"data_source": "d", "solution_str": a, "ground_truth": truth}) for a in answers]


def test_process_mode_isolates_failures(process_pool):
    assert process_pool.mode == "process"
    results = process_pool.run(calls("1", "raise", "hang", "exit", "2", "1"))
    assert [r.value for r in results] == [1.0, None, None, None, 0.0, 1.0]
    assert [r.ok for r in results] == [True, False, False, False, True, True]
    assert "ValueError: bad sample 1" in results[1].error and not results[1].timed_out
    assert results[2].timed_out and "timed out after 8 s (process killed)" in results[2].error
    assert "my_reward.py" in results[2].error and "compute_score" in results[2].error  # where it hung
    assert "exit code 3" in results[3].error and not results[3].timed_out
    # killed processes were replaced: the pool keeps working at full size
    assert [r.value for r in process_pool.run(calls("1", "1", "0"))] == [1.0, 1.0, 0.0]
    assert len(process_pool._workers) == 2


def test_an_idle_process_that_died_is_replaced(process_pool):
    process_pool.run(calls("1"))
    victim = process_pool._workers[0]
    victim.process.kill()
    victim.process.wait()
    assert [r.value for r in process_pool.run(calls("1", "1"))] == [1.0, 1.0]
    assert victim not in process_pool._workers


def test_arguments_that_cannot_be_pickled_fail_their_call_only(process_pool):
    results = process_pool.run(
        [((), {"data_source": "d", "solution_str": "1", "ground_truth": lambda: 1})] + calls("1")
    )
    assert "cannot be pickled" in results[0].error and results[1].value == 1.0


def test_file_function_merges_its_kwargs_over_the_call(user_file):
    fn = FileFunction(user_file, "compute_score", {"alpha": 2})
    assert fn("d", "kwargs", "1", beta=1, alpha=0) == {"beta": 1, "alpha": 2}
    clone = pickle.loads(pickle.dumps(fn))
    assert clone._fn is None and clone("d", "1", "1") == 1.0
    assert "compute_score" in repr(fn)


def test_async_functions_are_awaited(user_file):
    fn = FileFunction(user_file, "async_score")
    with RewardScorePool(fn, num_workers=1, timeout_s=10) as pool:
        assert pool.run(calls("1"))[0].value == {"score": 0.5, "acc": 1.0}
    assert RewardScorePool(fn, num_workers=0).run(calls("1"))[0].value == {"score": 0.5, "acc": 1.0}


def test_thread_mode_for_unpicklable_functions(caplog):
    def fn(data_source, solution_str, ground_truth):
        if solution_str == "raise":
            raise KeyError("oops")
        if solution_str == "hang":
            time.sleep(60)  # abandoned after the timeout (a daemon thread)
        return 1.0

    with caplog.at_level(logging.WARNING):  # a good call takes ~2 ms in a thread here: 5 s is ample
        pool = RewardScorePool(fn, num_workers=2, timeout_s=5)
    assert pool.mode == "thread" and "cannot be sent to a scoring process" in caplog.text
    results = pool.run(calls("1", "raise", "hang"))
    assert results[0].value == 1.0
    assert "KeyError: 'oops'" in results[1].error
    assert results[2].timed_out and "time.sleep(60)" in results[2].error
    pool.close()


def test_zero_workers_means_threads_and_no_timeout_means_none():
    pool = RewardScorePool(pool_module.call_score_fn, num_workers=0, timeout_s=None)
    assert pool.mode == "thread" and pool.timeout_s is None
    assert RewardScorePool(len, num_workers=0, timeout_s=0).timeout_s is None
    assert pool.run([((len, ["ab"], {}), {})])[0].value == 2


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_num_workers_is_validated(bad):
    with pytest.raises(ValueError, match="reward.num_workers"):
        RewardScorePool(len, num_workers=bad)


def test_timeout_is_validated():
    with pytest.raises(ValueError, match="reward.timeout_s"):
        RewardScorePool(len, timeout_s="30")


def test_a_function_the_worker_cannot_load_raises_at_once(tmp_path, monkeypatch):
    module = tmp_path / "vanishing_reward.py"
    module.write_text("def score(*args, **kwargs):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import vanishing_reward

    module.unlink()  # importable here (already imported), not in a fresh worker
    pool = RewardScorePool(vanishing_reward.score, num_workers=1, timeout_s=10)
    with pytest.raises(RuntimeError, match="cannot be loaded in a scoring process"):
        pool.run(calls("1"))
    # the same error when the worker already exited before it was given a call
    pool._workers.append(pool._new_worker())
    pool._workers[0].process.wait(timeout=30)
    with pytest.raises(RuntimeError, match="cannot be loaded in a scoring process"):
        pool.run(calls("1"))


def test_processes_that_keep_exiting_raise(user_file, monkeypatch):
    pool = RewardScorePool(FileFunction(user_file, "compute_score"), num_workers=1, timeout_s=10)

    class DeadWorker:
        task = None

        class conn:
            @staticmethod
            def poll():
                return False

        def alive(self):
            return False

        def kill(self):
            pass

        def stop(self):
            pass

    monkeypatch.setattr(pool, "_new_worker", DeadWorker)
    with pytest.raises(RuntimeError, match="keep exiting"):
        pool.run(calls("1"))


def test_stack_dump_of_a_finished_process_is_empty(user_file):
    pool = RewardScorePool(FileFunction(user_file, "compute_score"), num_workers=1)
    worker = pool._new_worker()
    worker.stop()
    assert worker.stack_dump() == ""
    pool.close()


def test_failure_log_logs_each_kind_once(caplog):
    log = FailureLog()
    first = ScoreResult(error='Traceback:\n  File "r.py", line 3, in f\nValueError: sample 1')
    same_kind = ScoreResult(error='Traceback:\n  File "r.py", line 3, in f\nValueError: sample 2')
    other = ScoreResult(error='Traceback:\n  File "r.py", line 9, in f\nKeyError: x')
    timeout = ScoreResult(error="timed out", timed_out=True)
    with caplog.at_level(logging.WARNING):
        assert log.report(first, "sample 0")
        assert not log.report(same_kind, "sample 1")
        assert log.report(other, "sample 2")
        assert log.report(timeout, "sample 3")
        assert not log.report(ScoreResult(error="timed out", timed_out=True), "sample 4")
    assert caplog.text.count("reward function") == 3
    assert "ValueError: sample 1" in caplog.text and "ValueError: sample 2" not in caplog.text
    assert "reward/timeout_count" in caplog.text


class TestLoadFunctionFromFile:
    def test_errors_name_the_config_key(self, user_file, tmp_path):
        with pytest.raises(FileNotFoundError, match="custom_reward_function.path"):
            load_function_from_file(tmp_path / "missing.py", "compute_score")
        with pytest.raises(AttributeError, match="custom_reward_function.name='nope'"):
            load_function_from_file(user_file, "nope")
        with pytest.raises(TypeError, match="not a function"):
            load_function_from_file(user_file, "not_callable")

    def test_a_file_that_fails_to_import_can_be_fixed_and_reloaded(self, tmp_path):
        path = tmp_path / "broken.py"
        path.write_text("raise RuntimeError('broken on import')\n")
        with pytest.raises(RuntimeError, match="broken on import"):
            load_function_from_file(path, "f")
        path.write_text(textwrap.dedent("def f():\n    return 4\n"))
        assert load_function_from_file(path, "f")() == 4

    def test_a_non_python_file_raises(self, tmp_path):
        path = tmp_path / "data.bin"
        path.write_bytes(b"\x00")
        with pytest.raises(ImportError, match="not a Python file"):
            load_function_from_file(path, "f")


def test_worker_processes_stop_with_the_pool(user_file):
    pool = RewardScorePool(FileFunction(user_file, "compute_score"), num_workers=1)
    pool.run(calls("1"))
    process = pool._workers[0].process
    pool.close()
    assert process.poll() is not None and pool._workers == []
    assert os.path.isdir(pool._dump_dir)  # kept for a restart; removed when the pool is collected
    dump_dir = pool._dump_dir
    del pool
    assert not os.path.exists(dump_dir)
