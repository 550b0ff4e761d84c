"""A step-scoped ``torch.profiler`` recording that writes one Chrome trace per profiled step.

::

    profiler = TorchProfiler(save_path="outputs/profile", role="actor", rank=0)
    profiler.start(step=3)
    ...  # the work to profile
    path = profiler.stop()  # outputs/profile/actor_rank0_step3.json

Open the trace in ``chrome://tracing`` or https://ui.perfetto.dev. Only one torch profiler can record in a process:
while one `TorchProfiler` runs, ``start`` of another (e.g. a second role fused into the same worker process) logs a
warning and records nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import ClassVar

import torch

from verl.utils.profiler.config import TORCH_PROFILER_CONTENTS

__all__ = ["TorchProfiler", "trace_path"]

logger = logging.getLogger(__name__)


def trace_path(save_path: str, role: str, rank: int, step: int) -> str:
    """``<save_path>/<role>_rank<rank>_step<step>.json``."""
    return os.path.join(save_path, f"{role}_rank{rank}_step{step}.json")


class TorchProfiler:
    """Records ``torch.profiler`` activity between ``start(step)`` and ``stop()``.

    Args:
        save_path: folder the traces go to (created on stop).
        role: names the trace files (``actor``, ``ref``, ``critic``, ``rollout``...).
        rank: this process's rank; names the trace files.
        contents: what to record, from ``cpu``, ``cuda``, ``memory``, ``shapes``, ``stack`` (veRL's
            ``tool_config.torch.contents``). Empty or None: CPU, plus CUDA when a GPU is visible, with input shapes,
            without stacks. ``cuda`` without a visible GPU is dropped with a warning.
    """

    _running: ClassVar[TorchProfiler | None] = None  # the one recording in this process

    def __init__(self, save_path: str, role: str = "worker", rank: int = 0, contents: Sequence[str] | None = None):
        if not save_path:
            raise ValueError("TorchProfiler needs a save_path (global_profiler.save_path)")
        contents = list(contents or [])
        unknown = [c for c in contents if c not in TORCH_PROFILER_CONTENTS]
        if unknown:
            raise ValueError(f"TorchProfiler contents has unknown entries {unknown}; use {TORCH_PROFILER_CONTENTS}")
        self.save_path = os.fspath(save_path)
        self.role = role
        self.rank = rank
        self.contents = contents
        self._prof: torch.profiler.profile | None = None
        self._step: int | None = None

    @property
    def active(self) -> bool:
        """Whether this profiler is recording."""
        return self._prof is not None

    @property
    def step(self) -> int | None:
        """The step being recorded (None when idle)."""
        return self._step

    def _activities(self) -> list[torch.profiler.ProfilerActivity]:
        wanted = set(self.contents) & {"cpu", "cuda"} or {"cpu", "cuda"}
        activities = []
        if "cpu" in wanted:
            activities.append(torch.profiler.ProfilerActivity.CPU)
        if "cuda" in wanted:
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            elif self.contents:  # asked for explicitly
                logger.warning("TorchProfiler: 'cuda' requested but no GPU is visible; recording CPU activity")
        return activities or [torch.profiler.ProfilerActivity.CPU]

    def start(self, step: int) -> bool:
        """Start recording step ``step``; returns whether recording started (False when another profiler of this
        process is recording). Starting while this one records raises RuntimeError."""
        if self.active:
            raise RuntimeError(f"TorchProfiler({self.role}, rank {self.rank}) is already recording step {self._step}")
        running = TorchProfiler._running
        if running is not None:
            logger.warning(
                "TorchProfiler(%s, rank %d): not recording step %s, the torch profiler of %r is already recording "
                "in this process",
                self.role,
                self.rank,
                step,
                running.role,
            )
            return False
        explicit = bool(self.contents)
        prof = torch.profiler.profile(
            activities=self._activities(),
            record_shapes="shapes" in self.contents if explicit else True,
            with_stack="stack" in self.contents,
            profile_memory="memory" in self.contents,
        )
        prof.start()
        self._prof, self._step = prof, int(step)
        TorchProfiler._running = self
        logger.info("TorchProfiler(%s, rank %d): recording step %d", self.role, self.rank, self._step)
        return True

    def stop(self) -> str | None:
        """Stop recording and write the Chrome trace; returns its path (None when nothing was recording)."""
        prof, step = self._prof, self._step
        if prof is None:
            return None
        self._prof, self._step = None, None
        if TorchProfiler._running is self:
            TorchProfiler._running = None
        prof.stop()
        os.makedirs(self.save_path, exist_ok=True)
        path = trace_path(self.save_path, self.role, self.rank, step)
        prof.export_chrome_trace(path)
        logger.info("TorchProfiler(%s, rank %d): wrote %s", self.role, self.rank, path)
        return path
