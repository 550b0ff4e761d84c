"""Rollout tracing's settings and its sample choice, without a backend service (the mlflow backend is checked on a
real agent-loop batch in tests/experimental/test_agent_loop.py; weave and trackio by veRL's own tests, which mock
them: neither is installed here)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from verl.experimental.agent_loop.worker import _trace_scopes
from verl.protocol import DataProto
from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_attr, rollout_trace_op


@pytest.fixture(autouse=True)
def fresh_settings():
    RolloutTraceConfig.reset()
    yield
    RolloutTraceConfig.reset()


class Loop:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    @rollout_trace_op
    async def run(self, x, y=2):
        self.calls.append((x, y))
        return x * y

    @rollout_trace_op
    def step(self, x):
        if x < 0:
            raise ValueError("negative")
        return -x


async def test_without_a_backend_or_with_dummy_ops_run_unchanged():
    for backend in (None, "dummy"):
        RolloutTraceConfig.reset()
        RolloutTraceConfig.init("p", "e", backend)
        loop = Loop()
        with rollout_trace_attr(sample_index=3, step=1, rollout_n=0):
            assert await loop.run(4) == 8 and loop.step(2) == -2
        with pytest.raises(ValueError, match="negative"):
            loop.step(-1)
        assert loop.calls == [(4, 2)] and RolloutTraceConfig.get_client() is None
    assert Loop.run.__name__ == "run" and Loop.step.__qualname__ == "Loop.step"  # functools.wraps


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match=r"rollout.trace.backend='wandb'; use one of"):
        RolloutTraceConfig.init("p", "e", "wandb")
    with pytest.raises(ValueError, match=r"max_samples_per_step_per_worker=-1"):
        RolloutTraceConfig.init("p", "e", None, max_samples_per_step_per_worker=-1)


def test_a_second_setup_in_the_process_is_reported_not_applied(caplog):
    RolloutTraceConfig.init("p", "e", "dummy")
    with caplog.at_level(logging.WARNING, logger="verl.utils.rollout_trace"):
        RolloutTraceConfig.init("p", "e", None)
        RolloutTraceConfig.init("p", "e", "dummy")  # the same settings again: nothing to say
    assert RolloutTraceConfig.get_backend() == "dummy"
    assert len(caplog.records) == 1 and "is not applied" in caplog.records[0].getMessage()


def batch(prompts: int, n: int, index: list | None = None) -> DataProto:
    rows = prompts * n
    data = DataProto.from_dict(
        {"prompt_index": torch.arange(rows) // n, "sample_index": torch.arange(rows) % n},
        {} if index is None else {"index": np.repeat(np.array(index, dtype=object), n)},
    )
    return data


def test_the_samples_to_trace_are_whole_groups_and_reproducible():
    RolloutTraceConfig.init("p", "e", "dummy", max_samples_per_step_per_worker=2)
    data = batch(prompts=5, n=3, index=[10, 11, 12, 13, 14])
    scopes = _trace_scopes(data, step=4, validate=False, seed=7)
    traced = [s for s in scopes if s["trace"]]
    assert len(traced) == 6 and {s["rollout_n"] for s in traced} == {0, 1, 2}  # every copy of 2 prompts
    assert len({s["sample_index"] for s in traced}) == 2 and {s["sample_index"] for s in scopes} == set(range(10, 15))
    assert all(type(s["sample_index"]) is int and s["step"] == 4 and s["validate"] is False for s in scopes)
    assert _trace_scopes(data, step=4, validate=False, seed=7) == scopes  # the same pick on a rerun
    state = np.random.get_state()[1].copy()
    _trace_scopes(data, step=5, validate=False, seed=7)
    assert np.array_equal(np.random.get_state()[1], state)  # the global generator did not move


def test_without_a_limit_every_sample_is_traced_under_its_prompt_index():
    RolloutTraceConfig.init("p", "e", "dummy")
    scopes = _trace_scopes(batch(prompts=2, n=2), step=1, validate=True, seed=0)
    assert [(s["sample_index"], s["rollout_n"], s["trace"]) for s in scopes] == [
        (0, 0, True),
        (0, 1, True),
        (1, 0, True),
        (1, 1, True),
    ]


async def test_trackio_records_each_op_as_a_chat_trace_with_the_samples_attributes(tmp_path):
    """trackio for real (its local store, TRACKIO_DIR set for the session by tests/conftest.py)."""
    from trackio.utils import TRACKIO_DIR

    from tests.utils.test_tracking import trackio_traces

    project = f"verl-trace-{tmp_path.name}"
    RolloutTraceConfig.init(project, "exp", "trackio")
    loop = Loop()
    with rollout_trace_attr(sample_index=5, step=2, rollout_n=1):
        assert await loop.run(3) == 6
        with pytest.raises(ValueError, match="negative"):
            loop.step(-1)
    with rollout_trace_attr(sample_index=6, step=2, rollout_n=0, trace=False):
        await loop.run(4)  # not traced
    RolloutTraceConfig.get_client().finish()
    traces = {t["metadata"]["op"]: t for t in trackio_traces(Path(TRACKIO_DIR) / "traces" / project / "exp")}
    assert sorted(traces) == ["Loop.run", "Loop.step"]
    ok, failed = traces["Loop.run"], traces["Loop.step"]
    assert ok["step"] == 2 and ok["metadata"]["sample_index"] == 5 and ok["metadata"]["rollout_n"] == 1
    assert ok["metadata"]["output"] == 6
    assert ok["messages"][0][1] == "verl rollout trace operation: Loop.run"  # (trackio stores "system" as "developer")
    assert json.loads(ok["messages"][1][1]) == {"inputs": {"x": 3, "y": 2}}
    assert failed["metadata"]["status"] == "error" and failed["metadata"]["exception_type"] == "ValueError"
    assert json.loads(failed["messages"][-1][1]) == {"exception_type": "ValueError", "exception": "negative"}
