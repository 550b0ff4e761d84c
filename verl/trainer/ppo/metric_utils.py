"""Per-step metrics with veRL's names: data statistics, stage timings, throughput, and the reduction of the
per-worker lists that come back in ``meta_info["metrics"]``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto

__all__ = ["compute_data_metrics", "compute_throughout_metrics", "compute_timing_metrics", "reduce_metrics"]


def reduce_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Lists of per-worker / per-mini-batch values → one number each: max for keys containing "max", min for
    "min", the mean otherwise."""
    out = {}
    for key, values in metrics.items():
        array = np.asarray(values if isinstance(values, list | tuple | np.ndarray) else [values], dtype=np.float64)
        if array.size == 0:
            continue
        if "max" in key:
            out[key] = float(np.max(array))
        elif "min" in key:
            out[key] = float(np.min(array))
        else:
            out[key] = float(np.mean(array))
    return out


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, float]:
    """``critic/score/*`` (sequence sums of ``token_level_scores``), ``critic/rewards/*``, ``critic/advantages/*``,
    ``critic/returns/*``, ``critic/values/*`` and ``critic/vf_explained_var`` (with a critic), ``response_length/*``
    (+ ``clip_ratio``), ``prompt_length/*`` (+ ``clip_ratio``)."""
    b = batch.batch
    response_mask = b["response_mask"].bool()
    max_response_length = b["responses"].shape[-1]
    prompt_mask = b["attention_mask"][:, :-max_response_length].bool()
    max_prompt_length = prompt_mask.shape[-1]
    response_length = response_mask.sum(-1).float()
    prompt_length = prompt_mask.sum(-1).float()
    metrics: dict[str, float] = {}
    metrics.update(_stats("critic/score", b["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", b["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", b["advantages"][response_mask]))
    metrics.update(_stats("critic/returns", b["returns"][response_mask]))
    if use_critic and "values" in b.keys():
        values = b["values"][response_mask]
        returns = b["returns"][response_mask]
        metrics.update(_stats("critic/values", values))
        variance = torch.var(returns)
        metrics["critic/vf_explained_var"] = float(1.0 - torch.var(returns - values) / (variance + 1e-5))
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = float((response_length == max_response_length).float().mean())
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = float((prompt_length == max_prompt_length).float().mean())
    return metrics


def _token_counts(batch: DataProto) -> dict[str, int]:
    b = batch.batch
    response = int(b["response_mask"].sum())
    prompt = int(b["attention_mask"][:, : -b["responses"].shape[-1]].sum())
    return {
        "gen": response,
        "ref": response + prompt,
        "values": response + prompt,
        "adv": response,
        "update_critic": response + prompt,
        "update_actor": response + prompt,
    }


def compute_timing_metrics(batch: DataProto, timing_raw: Mapping[str, float]) -> dict[str, float]:
    """``timing_s/<stage>`` for every timed stage and ``timing_per_token_ms/<stage>`` where tokens are known."""
    tokens = _token_counts(batch)
    metrics = {f"timing_s/{name}": float(seconds) for name, seconds in timing_raw.items()}
    for name, count in tokens.items():
        if name in timing_raw and count > 0:
            metrics[f"timing_per_token_ms/{name}"] = float(timing_raw[name]) * 1000.0 / count
    return metrics


def compute_throughout_metrics(batch: DataProto, timing_raw: Mapping[str, float], n_gpus: int) -> dict[str, float]:
    """``perf/total_num_tokens``, ``perf/time_per_step`` and ``perf/throughput`` (tokens per second per worker).
    (veRL's name, typo included.)"""
    b = batch.batch
    total_tokens = int(b["attention_mask"].sum())
    step_time = float(timing_raw.get("step", 0.0))
    metrics = {"perf/total_num_tokens": float(total_tokens), "perf/time_per_step": step_time}
    if step_time > 0 and n_gpus > 0:
        metrics["perf/throughput"] = total_tokens / (step_time * n_gpus)
    return metrics
