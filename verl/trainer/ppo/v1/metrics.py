"""`MetricsAggregator`: one value per metric for a global step made of several inner updates.

veRL 0.10's ``separate_async`` mode runs ``parameter_sync_step`` optimizer updates per global step and logs once;
each update's metrics are added here and reduced by name:

- **summed**: the eviction counts (``*/off_policy/evicted_samples``, ``*/filter_groups/evicted_samples``,
  ``*/filter_groups/discarded_surplus_samples``, ``*/rollout_failure/evicted_samples``), every ``timing_s/*`` and
  ``timing_per_token_ms/*``, and names containing ``sum`` or ``total``;
- **last**: ``training/global_step``, ``training/rollout_probs_diff_valid`` (a 0/1 flag) and learning rates
  (``*/lr``, ``*_lr``);
- **max** / **min**: names containing ``max`` / ``min``;
- otherwise the **mean weighted by the update's sample count** (a plain mean when no update gave a count); the
  staleness of evicted groups (``*/off_policy/evicted_samples_staleness/mean``) is weighted by the update's
  eviction count instead.

``global_seqlen/minmax_diff`` is recomputed from the reduced max and min. Booleans and tensors of more than one
element are not metrics and are skipped; the filtered-reward-count table (`DAPO_FILTERED_REWARD_COUNTS_KEY`, a
``{value: count}`` dict) is merged by adding counts.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np
import torch

from verl.utils.tracking.tables import FILTERED_REWARD_TABLE_KEY

__all__ = ["DAPO_FILTERED_REWARD_COUNTS_KEY", "MetricsAggregator"]

#: veRL 0.10's table of how many filtered groups had each value of the filter metric
DAPO_FILTERED_REWARD_COUNTS_KEY = FILTERED_REWARD_TABLE_KEY

_SUMMED = frozenset(
    f"{split}/{name}"
    for split in ("training", "validation")
    for name in (
        "off_policy/evicted_samples",
        "filter_groups/evicted_samples",
        "filter_groups/discarded_surplus_samples",
        "rollout_failure/evicted_samples",
    )
)
_LAST = frozenset({"training/global_step", "training/rollout_probs_diff_valid"})
_STALENESS_MEAN = "_staleness/mean"


def _scalar(value: Any) -> float | None:
    """``value`` as a float when it is one number (not a bool); else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float | np.number):
        return float(value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    return None


def reduction(name: str) -> str:
    """How ``name`` is reduced over the updates: ``sum``, ``last``, ``max``, ``min`` or ``mean`` (weighted)."""
    if name in _SUMMED:
        return "sum"
    lower = name.lower()
    if name in _LAST or lower == "lr" or lower.endswith(("/lr", "_lr")):
        return "last"
    if "timing_s/" in lower or "timing_per_token_ms/" in lower:
        return "sum"
    for word, kind in (("max", "max"), ("min", "min"), ("sum", "sum"), ("total", "sum")):
        if word in lower:
            return kind
    return "mean"


class MetricsAggregator:
    """Collects the metrics of a step's updates (:meth:`add_step_metrics`) and reduces them
    (:meth:`get_aggregated_metrics`; see the module docstring for the rules)."""

    def __init__(self) -> None:
        self.metric_values: dict[str, list[float]] = defaultdict(list)
        self.metric_weights: dict[str, list[float]] = defaultdict(list)
        self.dict_metrics: dict[str, Counter] = defaultdict(Counter)
        self.step_count = 0

    def add_step_metrics(self, metrics: dict[str, Any], sample_count: int = 0) -> None:
        """Record one update's ``metrics``; ``sample_count``: its (non-padding) samples, the weight of its means."""
        self.step_count += 1
        for name, value in metrics.items():
            if name == DAPO_FILTERED_REWARD_COUNTS_KEY and isinstance(value, dict):
                self.dict_metrics[name].update(value)
                continue
            number = _scalar(value)
            if number is None:
                continue
            self.metric_values[name].append(number)
            self.metric_weights[name].append(self._weight(name, metrics, sample_count))

    @staticmethod
    def _weight(name: str, metrics: dict[str, Any], sample_count: int) -> float:
        if name.endswith(_STALENESS_MEAN) and "/off_policy/evicted_samples" in name:
            evicted = _scalar(metrics.get(name[: -len(_STALENESS_MEAN)]))
            if evicted is not None:
                return evicted
        return float(sample_count)

    def _reduce(self, name: str, values: list[float]) -> float:
        kind = reduction(name)
        if kind == "last":
            return values[-1]
        if kind == "sum":
            return sum(values)
        if kind == "max":
            return max(values)
        if kind == "min":
            return min(values)
        weights = self.metric_weights[name]
        total = sum(weights)
        if total == 0:
            return sum(values) / len(values)
        return sum(v * w for v, w in zip(values, weights)) / total

    def get_aggregated_metrics(self) -> dict[str, Any]:
        """One value per metric name recorded since the last :meth:`reset` (``{}`` when nothing was added)."""
        if self.step_count == 0:
            return {}
        out: dict[str, Any] = {name: self._reduce(name, values) for name, values in self.metric_values.items()}
        out.update({name: dict(counts) for name, counts in self.dict_metrics.items() if counts})
        if "global_seqlen/max" in out and "global_seqlen/min" in out and "global_seqlen/minmax_diff" in out:
            out["global_seqlen/minmax_diff"] = out["global_seqlen/max"] - out["global_seqlen/min"]
        return out

    def reset(self) -> None:
        """Forget everything recorded."""
        self.metric_values.clear()
        self.metric_weights.clear()
        self.dict_metrics.clear()
        self.step_count = 0
