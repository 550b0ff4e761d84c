"""Schema of a role's ``profiler`` (``actor_rollout_ref.{actor,ref,rollout}.profiler``, ``critic.profiler``,
``reward_model.profiler``): veRL's field names and defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig

__all__ = ["RoleProfilerConfig", "role_tool_config"]


def role_tool_config() -> dict[str, Any]:
    """veRL's per-tool options of a role (only ``torch`` records anything here)."""
    return {
        "nsys": {"discrete": False},
        "npu": {"contents": [], "level": "level1", "analysis": True, "discrete": False},
        "torch": {"step_start": 0, "step_end": None},
        "torch_memory": {"trace_alloc_max_entries": 100000, "stack_depth": 32},
    }


@dataclass
class RoleProfilerConfig(BaseConfig):
    """Whether this role's workers are profiled in the steps of ``global_profiler.steps`` (with
    ``global_profiler.tool=torch``), as veRL: a role records only when ``enable`` is set.

    Args:
        tool: the profiler (follows ``global_profiler.tool``).
        enable: profile this role's workers.
        all_ranks: profile every rank; else only ``ranks`` (rank 0 when empty).
        ranks: the ranks to profile.
        save_path: folder of the traces (follows ``global_profiler.save_path``).
        tool_config.nsys.discrete: Nsight Systems: one trace per stage.
        tool_config.npu.contents: Ascend NPU profiler: what to record.
        tool_config.npu.level: Ascend NPU profiler level.
        tool_config.npu.analysis: Ascend NPU profiler: analyse after collecting.
        tool_config.npu.discrete: Ascend NPU profiler: one trace per stage.
        tool_config.torch.step_start: torch profiler: first step of the schedule inside a profiled step.
        tool_config.torch.step_end: torch profiler: last step of that schedule (null: the whole step).
        tool_config.torch_memory.trace_alloc_max_entries: CUDA memory snapshot: allocations kept.
        tool_config.torch_memory.stack_depth: CUDA memory snapshot: stack frames kept per allocation.
    """

    tool: str | None = None
    enable: bool = False
    all_ranks: bool = False
    ranks: list[int] = field(default_factory=list)
    save_path: str | None = None
    tool_config: dict[str, Any] = field(default_factory=role_tool_config)
