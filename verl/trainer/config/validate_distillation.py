"""Start-up checks of on-policy distillation (``distillation.*``, veRL 0.10)."""

from __future__ import annotations

from typing import Any

__all__ = ["check_distillation"]


def check_distillation(config: Any, problems: list[str]) -> None:
    """With ``distillation.enabled``: the section as :class:`~verl.workers.config.distillation.DistillationConfig`
    reads it (teachers, their pool, the loss) and each teacher's serving engine; each problem is appended."""
    section = config.get("distillation") or {}
    if not section.get("enabled", False):
        return
    from verl.experimental.teacher_loop.teacher_model import teacher_worker_config
    from verl.workers.config.distillation import DistillationConfig

    try:
        for teacher in DistillationConfig.from_config(section).teacher_models.values():
            teacher_worker_config(config, teacher)
    except ValueError as e:
        problems.append(str(e))
