"""Reducing per-worker / per-micro-batch metric lists to one number each (``verl.utils.metric``).

``reduce_metrics`` picks the reduction from the key (max / min / mean); a `MetricList` carries its own
(`AggregationType`), so e.g. a token count can be summed across workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from enum import Enum
from typing import Any

import numpy as np

__all__ = ["AggregationType", "AggregationTypeMismatchError", "Metric", "MetricList", "MetricValue", "reduce_metrics"]


class AggregationType(Enum):
    """How the values of one metric are combined."""

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_REDUCERS = {
    AggregationType.MEAN: np.mean,
    AggregationType.SUM: np.sum,
    AggregationType.MIN: np.min,
    AggregationType.MAX: np.max,
}


class AggregationTypeMismatchError(ValueError):
    """Values of one metric were recorded with two different aggregation types."""

    def __init__(self, expected: AggregationType, got: AggregationType) -> None:
        super().__init__(f"aggregation type mismatch: {expected.value} != {got.value}")


def _aggregation(aggregation: str | AggregationType) -> AggregationType:
    try:
        return AggregationType(aggregation)
    except ValueError:
        valid = [a.value for a in AggregationType]
        raise ValueError(f"aggregation={aggregation!r} is not one of {valid}") from None


def _scalar(value: Any) -> float | int:
    """A Python number from an int/float, a numpy scalar or a one-element tensor/array."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    if hasattr(value, "numel") or isinstance(value, np.ndarray | np.generic):
        array = np.asarray(value.detach().cpu() if hasattr(value, "detach") else value)
        if array.size != 1:
            raise ValueError(f"a metric value must be a scalar, got shape {tuple(array.shape)}")
        return array.item()
    raise TypeError(f"unsupported metric value type {type(value).__name__}: {value!r}")


class MetricValue:
    """One value of a metric together with how it aggregates."""

    def __init__(self, value: Any, aggregation: str | AggregationType) -> None:
        self.value = _scalar(value)
        self.aggregation = _aggregation(aggregation)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], aggregation: str | AggregationType) -> dict[str, MetricValue]:
        """``{key: MetricValue(value, aggregation)}`` for every item of ``data``."""
        return {key: cls(value, aggregation) for key, value in data.items()}

    def init_list(self) -> MetricList:
        """An empty `MetricList` with this value's aggregation."""
        return MetricList(aggregation=self.aggregation)

    def __repr__(self) -> str:
        return f"MetricValue({self.value!r}, {self.aggregation.value!r})"


class MetricList:
    """The values of one metric, reduced with its `AggregationType` by :meth:`aggregate`."""

    def __init__(self, aggregation: str | AggregationType, values: list[float] | None = None) -> None:
        self.aggregation = _aggregation(aggregation)
        self.values: list[float] = [] if values is None else list(values)

    def append(self, value: Any) -> None:
        """Add a number (or a `MetricValue` of the same aggregation)."""
        if isinstance(value, MetricValue):
            if value.aggregation != self.aggregation:
                raise AggregationTypeMismatchError(self.aggregation, value.aggregation)
            value = value.value
        self.values.append(_scalar(value))

    def extend(self, values: MetricList | Iterable[Any]) -> None:
        """Add every value of another `MetricList` (same aggregation) or of an iterable."""
        if isinstance(values, MetricList):
            if values.aggregation != self.aggregation:
                raise AggregationTypeMismatchError(self.aggregation, values.aggregation)
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> float:
        """The reduction of the values (NaN when there are none)."""
        if not self.values:
            return float("nan")
        return float(_REDUCERS[self.aggregation](np.asarray(self.values, dtype=np.float64)))

    @classmethod
    def chain(cls, metric_lists: list[MetricList]) -> MetricList:
        """One list holding the values of all ``metric_lists`` (which must share an aggregation)."""
        if not metric_lists:
            return cls(aggregation=AggregationType.MEAN)
        chained = cls(aggregation=metric_lists[0].aggregation)
        for metric_list in metric_lists:
            chained.extend(metric_list)
        return chained

    @classmethod
    def aggregate_dp(cls, metric_lists: Sequence[MetricList]) -> float:
        """One number from one list per data-parallel rank, each holding that rank's per-micro-batch values.

        SUM / MEAN: the mean over ranks of each micro-batch's value, then the list's aggregation (a partial sum per
        micro-batch stays a sum of per-rank means); MIN / MAX: over every value. Every rank must hold as many
        values as the others (ValueError otherwise)."""
        if not metric_lists:
            raise ValueError("Cannot aggregate an empty list of metrics.")
        aggregation = metric_lists[0].aggregation
        for metric_list in metric_lists[1:]:
            if metric_list.aggregation != aggregation:
                raise AggregationTypeMismatchError(aggregation, metric_list.aggregation)
        lengths = [len(metric_list.values) for metric_list in metric_lists]
        if len(set(lengths)) != 1:
            raise ValueError(f"All Metric instances must have the same number of values for dp aggregation: {lengths}")
        per_rank = np.asarray([metric_list.values for metric_list in metric_lists], dtype=np.float64)
        if aggregation in (AggregationType.SUM, AggregationType.MEAN):
            values = per_rank.mean(axis=0)
        else:
            values = per_rank.ravel()
        return float(_REDUCERS[aggregation](values))

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.aggregation.value!r}, {self.values!r})"


class Metric(MetricList):
    """veRL's one-class metric: a `MetricList` built from an optional first value (or list of values).

    ``append`` also takes another `MetricList`/`Metric` (its values are added, aggregations must match).
    """

    def __init__(self, aggregation: str | AggregationType, value: Any = None) -> None:
        super().__init__(aggregation)
        if isinstance(value, list | tuple):
            self.extend(value)
        elif value is not None:
            self.append(value)

    def append(self, value: Any) -> None:
        """Add a number, a scalar tensor, a `MetricValue` or every value of another `MetricList`."""
        if isinstance(value, MetricList):
            self.extend(value)
        else:
            super().append(value)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], aggregation: str | AggregationType) -> dict[str, Metric]:
        """``{key: Metric(aggregation, value)}`` for every item of ``data``."""
        return {key: cls(aggregation, value) for key, value in data.items()}

    def init_list(self) -> Metric:
        """An empty `Metric` with this one's aggregation."""
        return Metric(self.aggregation)


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Lists of per-worker / per-mini-batch values → one number each: a `MetricList` by its own aggregation, else
    max for keys containing "max", min for "min", the mean otherwise; a list of `Metric` / `MetricValue` objects
    (one per micro-batch) by their shared aggregation. Keys with no values are dropped (veRL keeps them as NaN:
    an empty list means nothing was measured, which a NaN in a tracker would read as a numeric failure).

    As in veRL, a ``dict`` is reduced in place and returned; any other mapping gives a new dict.
    """
    out = {}
    for key, values in metrics.items():
        reduced = _reduce_one(key, values)
        if reduced is not None:
            out[key] = reduced
    if isinstance(metrics, dict):
        metrics.clear()
        metrics.update(out)
        return metrics
    return out


def _reduce_one(key: str, values: Any) -> float | None:
    if isinstance(values, MetricList):
        return values.aggregate() if values.values else None
    if isinstance(values, MetricValue):
        values = values.value
    if isinstance(values, list | tuple) and values and isinstance(values[0], MetricList | MetricValue):
        return _reduce_typed(values)
    items = values if isinstance(values, list | tuple | np.ndarray) else [values]
    try:
        array = np.asarray(items, dtype=np.float64)
    except (TypeError, ValueError):  # tensors on an accelerator, numpy scalars mixed with tensors...
        array = np.asarray([_scalar(v) for v in np.asarray(items, dtype=object).ravel()], dtype=np.float64)
    if array.size == 0:
        return None
    if "max" in key:
        return float(np.max(array))
    if "min" in key:
        return float(np.min(array))
    return float(np.mean(array))


def _reduce_typed(values: list[Any] | tuple[Any, ...]) -> float | None:
    """A list of `MetricList` / `MetricValue` (e.g. one per micro-batch, gathered by ``append_to_dict``) as one
    list of their aggregation; mixing aggregations (or plain numbers) raises."""
    first = values[0]
    merged = MetricList(aggregation=first.aggregation)
    for value in values:
        if not isinstance(value, MetricList | MetricValue):
            raise TypeError(f"cannot mix {type(value).__name__} with {type(first).__name__} values of one metric")
        if isinstance(value, MetricList):
            merged.extend(value)
        else:
            merged.append(value)
    return merged.aggregate() if merged.values else None
