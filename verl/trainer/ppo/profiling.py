"""The trainer's profiling around steps (``global_profiler``): which steps are traced, and starting / stopping the
workers' profilers — veRL's ``_start_profiling`` / ``_stop_profiling`` helpers, mixed into ``RayPPOTrainer``."""

from __future__ import annotations

from typing import Any

__all__ = ["TrainerProfiling"]


class TrainerProfiling:
    """Profiling for a trainer with ``config``, ``global_steps`` and the worker groups ``actor_rollout_wg``,
    ``critic_wg``, ``rm_wg``. ``global_profiler.tool`` set: the steps of ``global_profiler.steps`` are traced, each
    on its own or, with ``profile_continuous_steps``, one trace per run of consecutive steps."""

    config: Any
    global_steps: int
    _profile_steps: set[int]  # set by _init_profiling
    _profile_continuous: bool

    def _init_profiling(self) -> None:
        profiler = self.config.get("global_profiler") or {}
        self._profile_steps = set(profiler.get("steps") or []) if profiler.get("tool") else set()
        self._profile_continuous = bool(profiler.get("profile_continuous_steps", False))

    def _start_profiling(self, do_profile: bool) -> None:
        """Start the torch profiler of every worker group (``global_profiler``) when ``do_profile``."""
        if do_profile:
            save_path = (self.config.get("global_profiler") or {}).get("save_path") or "outputs/profile"
            for wg in self._worker_groups():
                wg.start_profile(profile_step=self.global_steps, save_path=save_path)

    def _stop_profiling(self, do_profile: bool) -> None:
        """Stop the profilers started by :meth:`_start_profiling` and write their traces."""
        if do_profile:
            for wg in self._worker_groups():
                wg.stop_profile()

    def _worker_groups(self) -> list[Any]:
        groups = (
            getattr(self, "actor_rollout_wg", None),
            getattr(self, "critic_wg", None),
            getattr(self, "rm_wg", None),
        )
        return [wg for wg in groups if wg is not None]

    def _profile_edge(self, step: int, neighbour: int) -> bool:
        """Whether the profiler starts (``neighbour=-1``) or stops (``+1``) at ``step``: at every step of
        ``global_profiler.steps``, or with ``profile_continuous_steps`` only where a run of consecutive steps begins
        or ends (one trace for the run)."""
        if step not in self._profile_steps:
            return False
        return not self._profile_continuous or step + neighbour not in self._profile_steps
