"""Metric reduction helpers (veRL's ``verl.utils.metric``): `reduce_metrics` and typed aggregations."""

from verl.utils.metric.utils import (
    AggregationType,
    AggregationTypeMismatchError,
    Metric,
    MetricList,
    MetricValue,
    reduce_metrics,
)

__all__ = ["AggregationType", "AggregationTypeMismatchError", "Metric", "MetricList", "MetricValue", "reduce_metrics"]
