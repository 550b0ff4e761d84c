"""Profiler options of a role (``<role>.profiler``) and of the torch profiler tool (veRL's field names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.base_config import BaseConfig

__all__ = ["PROFILER_TOOLS", "TORCH_PROFILER_CONTENTS", "ProfilerConfig", "TorchProfilerToolConfig"]

# Tools veRL knows; only "torch" records anything here (the others log a warning and do nothing).
PROFILER_TOOLS = ("torch", "torch_memory", "nsys", "npu")
# What the torch profiler records: activities (cpu, cuda) and extras (memory, shapes, stack).
TORCH_PROFILER_CONTENTS = ("cpu", "cuda", "memory", "shapes", "stack")


@dataclass
class TorchProfilerToolConfig(BaseConfig):
    """``tool_config.torch``: ``contents`` lists what to record (empty: cpu + cuda + shapes); ``discrete`` is
    accepted for veRL compatibility (one trace per profiled step is what is written here)."""

    contents: list[str] = field(default_factory=list)
    discrete: bool = False

    def __post_init__(self) -> None:
        unknown = [c for c in self.contents if c not in TORCH_PROFILER_CONTENTS]
        if unknown:
            raise ValueError(f"tool_config.torch.contents has unknown entries {unknown}; use {TORCH_PROFILER_CONTENTS}")


@dataclass
class ProfilerConfig(BaseConfig):
    """Whether and where a role profiles.

    Args:
        tool: "torch" (the torch profiler), or veRL's "nsys" / "npu" / "torch_memory" (not available here); None off.
        enable: profile this role at all.
        all_ranks: profile every rank; else only ``ranks`` (rank 0 when empty).
        ranks: the ranks to profile.
        save_path: folder of the traces.
        tool_config: the tool's options (for "torch" a `TorchProfilerToolConfig` or a mapping of its fields).
        global_tool_config: veRL's trainer-wide tool options; accepted, unused.
    """

    tool: str | None = None
    enable: bool = False
    all_ranks: bool = False
    ranks: list[int] = field(default_factory=list)
    save_path: str | None = "outputs/profile"
    tool_config: Any = None
    global_tool_config: Any = None

    def __post_init__(self) -> None:
        if self.tool is not None and self.tool not in PROFILER_TOOLS:
            raise ValueError(f"profiler.tool={self.tool!r}; use one of {list(PROFILER_TOOLS)} or null")
        if not isinstance(self.ranks, list | tuple | set) or not all(isinstance(r, int) for r in self.ranks):
            raise ValueError(f"profiler.ranks={self.ranks!r} must be a list of integer ranks")

    def profiles_rank(self, rank: int) -> bool:
        """Whether ``rank`` is profiled (ignoring ``enable``)."""
        return self.all_ranks or (rank in self.ranks if self.ranks else rank == 0)

    def union(self, other: ProfilerConfig) -> ProfilerConfig:
        """A config profiling every rank either profiles."""
        return ProfilerConfig(
            tool=self.tool or other.tool,
            enable=self.enable or other.enable,
            all_ranks=self.all_ranks or other.all_ranks,
            ranks=sorted(set(self.ranks) | set(other.ranks)),
            save_path=self.save_path or other.save_path,
            tool_config=self.tool_config if self.tool_config is not None else other.tool_config,
        )

    def intersect(self, other: ProfilerConfig) -> ProfilerConfig:
        """A config profiling only the ranks both profile."""
        return ProfilerConfig(
            tool=self.tool if self.tool == other.tool else None,
            enable=self.enable and other.enable,
            all_ranks=self.all_ranks and other.all_ranks,
            ranks=sorted(set(self.ranks) & set(other.ranks)),
            save_path=self.save_path,
            tool_config=self.tool_config,
        )
