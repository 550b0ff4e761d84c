"""veRL 0.10's hybrid switch in ``separate_async`` (``trainer.v1.separate_async.hybrid_rollout.*``): the training
workers' own engines are lent to generation while the trainer would wait for groups, and reclaimed before it trains.

The training workers then hold an engine each (role ``actor_rollout``), beside the rollout pool's servers. Between
steps, after the weight push, the trainer decides whether to **lend** them (``switch_to_rollout``): when fewer groups
are sampleable than the *threshold* (``switch_threshold_ratio`` × ``train_batch_size``, at least one mini-batch), and
the time the lent engines would save — the samples missing × the measured seconds per missing sample × the share
of generation they add — is not less than a switch's measured cost (``switch_cost_window_size`` switches
averaged). Lending loads the step's weights into the engines and adds them to the agent loops' routing. At the next
step the trainer waits until the threshold is sampleable (``timing_s/switch_wait``) and **reclaims** them
(``switch_to_trainer``): out of the routing, their requests in flight finished (veRL aborts them and resumes them
elsewhere: partial rollout, not built for this mode), their memory freed.

With ``adaptive_switch_threshold`` the ratio rises by ``switch_threshold_step_up`` after
``switch_threshold_release_steps`` steps in a row in which the trainer waited for samples, and falls by
``switch_threshold_step_down`` (not below one mini-batch) after as many calm steps. Metrics, veRL's:
``separate_async/switch/{threshold_ratio,wait_samples,idle}``, ``separate_async/decision/{sampleable_count,remaining,
should_switch_to_rollout,per_sample_time_seconds,effective_switch_cost_seconds}``; and this project's
``separate_async/switch/lent_requests``: the requests the lent engines were sent while lent.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from typing import Any

from verl.utils.profiler import marked_timer

__all__ = ["HybridSwitch", "SwitchSettings"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SwitchSettings:
    """``trainer.v1.separate_async.hybrid_rollout`` (veRL's keys and defaults)."""

    switch_threshold_ratio: float = 0.4
    adaptive_switch_threshold: bool = True
    switch_threshold_step_up: float = 0.05
    switch_threshold_step_down: float = 0.03
    switch_threshold_release_steps: int = 2
    switch_cost_window_size: int = 3

    @classmethod
    def from_config(cls, section: Any) -> SwitchSettings:
        known = {key: section.get(key) for key in cls.__dataclass_fields__ if section.get(key) is not None}
        settings = cls(**known)
        if not 0 < settings.switch_threshold_ratio <= 1:
            raise ValueError(
                f"trainer.v1.separate_async.hybrid_rollout.switch_threshold_ratio={settings.switch_threshold_ratio}: "
                "a share of the batch in (0, 1]"
            )
        if settings.switch_cost_window_size <= 0 or settings.switch_threshold_release_steps <= 0:
            raise ValueError("trainer.v1.separate_async.hybrid_rollout: the window and the release steps must be > 0")
        return settings


class HybridSwitch:
    """Lends the training workers' engines to generation between steps (see the module docstring).

    Args:
        settings: the ``hybrid_rollout`` keys.
        train_batch_size / parts: the step's groups and its mini-batches (``parameter_sync_step``).
        scaling: (training workers + rollout servers) / rollout servers: how much faster generation runs lent.
        actor_wg: the training workers (``update_weights(version, to="engine")``, ``sleep``).
        manager: the agent-loop manager (``add_servers`` / ``remove_servers`` / ``wait_drained`` / ``served_by``).
        handles: the training workers' engines as replicas of the routing.
        poll_interval: the buffer's; a step whose samples took longer than this to come counts as idle.
    """

    def __init__(
        self,
        settings: SwitchSettings,
        train_batch_size: int,
        parts: int,
        scaling: float,
        actor_wg: Any,
        manager: Any,
        handles: list[Any],
        poll_interval: float,
    ) -> None:
        self.settings, self.train_batch_size, self.parts = settings, int(train_batch_size), int(parts)
        self.scaling = float(scaling)
        self.actor_wg, self.manager, self.handles = actor_wg, manager, list(handles)
        self.poll_interval = float(poll_interval)
        self.ratio = settings.switch_threshold_ratio
        self.lent = False
        self._idle_steps = self._calm_steps = 0
        self._wait_seconds, self._wait_samples = 0.0, 0
        self._step_wait_seconds, self._step_wait_samples = 0.0, 0
        self._to_rollout: collections.deque[float] = collections.deque(maxlen=settings.switch_cost_window_size)
        self._to_trainer: collections.deque[float] = collections.deque(maxlen=settings.switch_cost_window_size)
        self._served_at_lend = 0

    # ------------------------------------------------------------------ the threshold
    def threshold(self) -> int:
        """Groups that must be sampleable before the trainer reclaims its engines: the ratio of the batch, at least
        one mini-batch, at most the batch."""
        mini = self.train_batch_size // self.parts
        return min(max(round(self.ratio * self.train_batch_size), mini), self.train_batch_size)

    def adapt(self, had_idle: bool) -> None:
        """Raise the ratio after ``release_steps`` idle steps in a row, lower it after as many calm ones."""
        s = self.settings
        if had_idle:
            self._calm_steps = 0
            self._idle_steps = min(self._idle_steps + 1, s.switch_threshold_release_steps)
            if self._idle_steps >= s.switch_threshold_release_steps:
                self.ratio = min(1.0, self.ratio + s.switch_threshold_step_up)
            return
        self._idle_steps = 0
        self._calm_steps = min(self._calm_steps + 1, s.switch_threshold_release_steps)
        if self._calm_steps >= s.switch_threshold_release_steps:
            self.ratio = max(1.0 / self.parts, self.ratio - s.switch_threshold_step_down)

    # ------------------------------------------------------------------ the step
    def note_sample(self, missing: int, seconds: float) -> None:
        """A mini-batch was sampled: ``missing`` groups were not sampleable when asked, and it took ``seconds``."""
        self._step_wait_samples += max(0, missing)
        self._step_wait_seconds += seconds

    def reclaim_if_lent(self, buffer: Any, global_steps: int, timing: dict[str, float]) -> dict[str, Any]:
        """Step start: with the engines lent, wait until the threshold is sampleable, then take them back. Returns
        the evictions' metrics of the wait."""
        self._step_wait_seconds, self._step_wait_samples = 0.0, 0
        if not self.lent:
            return {}
        threshold = self.threshold()
        with marked_timer("switch_wait", timing):
            _, metrics = buffer.wait_for_sampleable(global_steps, "train", threshold)
        start = time.perf_counter()
        with marked_timer("switch_to_trainer", timing):
            self.manager.remove_servers(self.handles)
            self.manager.wait_drained(self.handles)
            self.actor_wg.sleep()
        self._to_trainer.append(time.perf_counter() - start)
        self.lent = False
        metrics["separate_async/switch/lent_requests"] = self.manager.served_by(self.handles) - self._served_at_lend
        logger.info("hybrid switch: the training workers' engines are back (%d groups sampleable)", threshold)
        return metrics

    def decide(self, buffer: Any, global_steps: int, total_steps: int) -> tuple[bool, dict[str, Any]]:
        """Before the step's push: adapt the threshold and decide whether to lend the engines for the next step.
        Returns the decision and its metrics."""
        s = self.settings
        ratio_used = self.ratio
        had_idle = self._step_wait_seconds > self.poll_interval
        if self._step_wait_samples > 0 and self._step_wait_seconds > 0:
            self._wait_seconds += self._step_wait_seconds
            self._wait_samples += self._step_wait_samples
        if s.adaptive_switch_threshold:
            self.adapt(had_idle)
        threshold = self.threshold()
        sampleable = buffer.get_sampleable_count(global_steps + 1, "train")
        remaining = max(0, threshold - sampleable)
        per_sample = self._wait_seconds / self._wait_samples if self._wait_samples else None
        cost = (
            sum(self._to_rollout) / len(self._to_rollout) + sum(self._to_trainer) / len(self._to_trainer)
            if self._to_rollout and self._to_trainer
            else None
        )
        benefit = None if per_sample is None else remaining * per_sample * (1.0 - 1.0 / self.scaling)
        lend = global_steps < total_steps and remaining > 0 and (benefit is None or cost is None or benefit > cost)
        metrics: dict[str, Any] = {
            "separate_async/switch/threshold_ratio": ratio_used,
            "separate_async/switch/wait_samples": float(self._step_wait_samples),
            "separate_async/switch/idle": float(had_idle),
            "separate_async/decision/sampleable_count": float(sampleable),
            "separate_async/decision/remaining": float(remaining),
            "separate_async/decision/should_switch_to_rollout": float(lend),
        }
        if per_sample is not None:
            metrics["separate_async/decision/per_sample_time_seconds"] = per_sample
        if cost is not None:
            metrics["separate_async/decision/effective_switch_cost_seconds"] = cost
        return lend, metrics

    def lend(self, version: int, timing: dict[str, float]) -> None:
        """After the push: load weight ``version`` into the training workers' engines (waking their memory) and add
        them to the routing."""
        start = time.perf_counter()
        with marked_timer("switch_to_rollout", timing):
            self.actor_wg.update_weights(version=version, to="engine")
            self.manager.add_servers(self.handles)
        self._to_rollout.append(time.perf_counter() - start)
        self._served_at_lend = self.manager.served_by(self.handles)
        self.lent = True
        logger.info("hybrid switch: the training workers' engines are lent to generation (weight version %d)", version)
