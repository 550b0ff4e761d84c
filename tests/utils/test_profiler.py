"""The torch profiler really records: a Chrome trace per profiled step, with the ops run between start and stop."""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch

from verl.utils.profiler import DistProfiler, ProfilerConfig, TorchProfiler


def _events(path: str) -> list[dict]:
    with open(path) as f:
        trace = json.load(f)
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def _matmul() -> torch.Tensor:
    a = torch.randn(64, 64)
    return (a @ a).sum()


def test_torch_profiler_writes_a_chrome_trace_of_the_step(tmp_path):
    profiler = TorchProfiler(save_path=str(tmp_path / "prof"), role="actor", rank=3)
    assert profiler.stop() is None  # nothing recording yet
    assert profiler.start(step=7) and profiler.active and profiler.step == 7
    with pytest.raises(RuntimeError, match="already recording step 7"):
        profiler.start(step=8)
    _matmul()
    path = profiler.stop()
    assert path == str(tmp_path / "prof" / "actor_rank3_step7.json") and os.path.isfile(path)
    names = {e.get("name") for e in _events(path)}
    assert names & {"aten::mm", "aten::matmul"}, sorted(n for n in names if n)[:20]
    assert not profiler.active
    # the profiler can record another step afterwards
    profiler.start(step=8)
    _matmul()
    assert profiler.stop().endswith("actor_rank3_step8.json")


def test_only_one_torch_profiler_records_per_process(tmp_path, caplog):
    first = TorchProfiler(str(tmp_path), role="actor", rank=0, contents=["cpu"])
    second = TorchProfiler(str(tmp_path), role="ref", rank=0)
    first.start(step=1)
    try:
        with caplog.at_level(logging.WARNING, logger="verl.utils.profiler.torch_profile"):
            assert second.start(step=1) is False
        assert "already recording" in caplog.text and second.stop() is None
    finally:
        first.stop()
    with pytest.raises(ValueError, match=r"unknown entries \['gpu'\]"):
        TorchProfiler(str(tmp_path), contents=["gpu"])
    with pytest.raises(ValueError, match="needs a save_path"):
        TorchProfiler("")


def test_dist_profiler_records_on_selected_ranks_and_annotates(tmp_path):
    config = ProfilerConfig(
        tool="torch", enable=True, ranks=[0], save_path=str(tmp_path), tool_config={"torch": {"contents": ["cpu"]}}
    )

    class Worker:
        def __init__(self, rank: int) -> None:
            self.profiler = DistProfiler(rank, config, role="critic")

        @DistProfiler.annotate(message="update_critic")
        def update(self) -> torch.Tensor:
            return _matmul()

    profiled, skipped = Worker(0), Worker(1)
    assert profiled.profiler.check_enable() and not skipped.profiler.check_this_rank()
    for worker in (profiled, skipped):
        worker.profiler.start(profile_step=2)
        worker.update()
    assert skipped.profiler.stop() is None
    path = profiled.profiler.stop()
    assert path == str(tmp_path / "critic_rank0_step2.json")
    assert "update_critic" in {e.get("name") for e in _events(path)}
    assert DistProfiler(0, ProfilerConfig(tool="torch", enable=False)).stop() is None  # disabled: no-op


def test_dist_profiler_extension_exposes_start_and_stop_profile(tmp_path):
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.utils.profiler import DistProfilerExtension

    config = ProfilerConfig(tool="torch", enable=True, all_ranks=True, save_path=str(tmp_path))

    class Role(DistProfilerExtension):
        def __init__(self) -> None:
            DistProfilerExtension.__init__(self, DistProfiler(rank=1, config=config, role="rollout"))

    assert isinstance(getattr(Role.start_profile, MAGIC_ATTR), dict)  # driver-callable on every rank
    role = Role()
    role.start_profile(profile_step=4)
    _matmul()
    assert role.stop_profile() == str(tmp_path / "rollout_rank1_step4.json")
