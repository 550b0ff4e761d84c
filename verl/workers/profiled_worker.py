"""`ProfiledWorker`: the base of the FSDP workers, with veRL's profiler calls and the user's registrations."""

from __future__ import annotations

from typing import Any

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.utils.import_utils import import_external_libs
from verl.utils.profiler import DistProfiler, DistProfilerExtension, ProfilerConfig

__all__ = ["ProfiledWorker"]


class ProfiledWorker(Worker, DistProfilerExtension):
    """A worker with veRL's ``start_profile`` / ``stop_profile`` (`DistProfilerExtension`): the torch profiler over
    what the role's ranks run in between (``global_profiler.tool=torch``; the role's ``profiler.enable``,
    ``all_ranks`` / ``ranks`` and ``save_path`` as veRL), one trace per rank and step. Every worker imports
    ``model.external_lib`` first, so the module's registrations (architectures, estimators, losses) exist in the
    worker too."""

    profile_role = "worker"

    def __init__(self, external_lib: str | list[str] | None = None, profiler: Any = None) -> None:
        Worker.__init__(self)
        import_external_libs(external_lib)
        self.profiler_config = dict(profiler or {})
        DistProfilerExtension.__init__(self, DistProfiler(self.rank))  # off until start_profile

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, profile_step: int | None = None, save_path: str = "outputs/profile", **kwargs: Any) -> None:
        """Start the torch profiler for step ``profile_step`` (a profile still running is written first); a role
        without ``profiler.enable`` records nothing."""
        if self.profiler.check_this_step():
            self.profiler.stop()
        role = self.profiler_config
        config = ProfilerConfig(
            tool="torch",
            enable=bool(role.get("enable", False)),
            all_ranks=bool(role.get("all_ranks", False)),
            ranks=list(role.get("ranks") or []),
            save_path=role.get("save_path") or save_path,
        )
        self.profiler = DistProfiler(self.rank, config, role=self.profile_role)
        self.profiler.start(profile_step=profile_step)
