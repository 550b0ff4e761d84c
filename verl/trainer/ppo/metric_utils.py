"""Per-step metrics with veRL's names: data statistics, stage timings, throughput, the reduction of the
per-worker lists that come back in ``meta_info["metrics"]``, and the validation statistics (``mean@N``,
bootstrapped ``best@K`` / ``worst@K`` / ``maj@K``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verl.protocol import DataProto
from verl.utils.metric import reduce_metrics  # re-exported here, veRL's older import path

__all__ = [
    "bootstrap_metric",
    "calc_maj_val",
    "compute_data_metrics",
    "compute_partial_rollout_metrics",
    "compute_staleness_metrics",
    "compute_throughout_metrics",
    "compute_timing_metrics",
    "process_validation_metrics",
    "reduce_metrics",
]


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{prefix}/mean": float(values.mean()),
        f"{prefix}/max": float(values.max()),
        f"{prefix}/min": float(values.min()),
    }


def compute_staleness_metrics(batch: DataProto, weight_version: int) -> dict[str, float]:
    """``async/weight_version``: the version of the weights the step trains from; ``async/staleness/{mean,max}``:
    over the samples, how many versions older than that the oldest token of each is (from each sample's
    ``weight_version_ranges``; samples without recorded versions are left out). 0 in ``sync``."""
    metrics = {"async/weight_version": float(weight_version)}
    ranges = batch.non_tensor_batch.get("weight_version_ranges")
    oldest = [min(v for _, _, v in sample) for sample in ranges if len(sample)] if ranges is not None else []
    if oldest:
        staleness = weight_version - np.asarray(oldest, dtype=np.float64)
        metrics["async/staleness/mean"] = float(staleness.mean())
        metrics["async/staleness/max"] = float(staleness.max())
    return metrics


def compute_partial_rollout_metrics(batch: DataProto) -> dict[str, float]:
    """veRL's ``fully_async/partial/{total_partial_num,partial_ratio,max_partial_span}``: the samples whose tokens
    come from more than one weight version (a request resumed with newer weights), their share of the batch and the
    widest span of versions in one sample; and ``fully_async/partial/resumed_requests``: how often the version
    changes inside the samples' responses (each change is a request aborted at a push and resumed), from the
    samples' ``weight_version_ranges``."""
    ranges = batch.non_tensor_batch.get("weight_version_ranges")
    samples = [sample for sample in ranges if len(sample)] if ranges is not None else []
    if not samples:
        return {}
    spans = np.array([max(v for *_, v in s) - min(v for *_, v in s) for s in samples], dtype=np.float64)
    changes = sum(sum(a[2] != b[2] for a, b in zip(s, s[1:])) for s in samples)
    return {
        "fully_async/partial/total_partial_num": float((spans > 0).sum()),
        "fully_async/partial/partial_ratio": float((spans > 0).mean()),
        "fully_async/partial/max_partial_span": float(spans.max()),
        "fully_async/partial/resumed_requests": float(changes),
    }


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, float]:
    """``critic/score/*`` (sequence sums of ``token_level_scores``), ``critic/rewards/*``, ``critic/advantages/*``,
    ``critic/returns/*``, ``critic/values/*`` and ``critic/vf_explained_var`` (with a critic), ``response_length/*``
    (+ ``clip_ratio``), ``response/aborted_ratio`` (samples with an empty response: aborted before their first token)
    and ``response_length_non_aborted/*`` over the others, ``prompt_length/*`` (+ ``clip_ratio``), and
    ``num_turns/{min,max,mean}`` when the agent loops recorded ``__num_turns__`` (and ``tool_call_counts/{min,max,
    mean}`` when the tool agent ran)."""
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
    aborted = response_length == 0  # veRL's reading: a request aborted before its first token
    metrics["response/aborted_ratio"] = float(aborted.float().mean())
    kept = response_length[~aborted]
    if kept.numel():
        metrics.update(_stats("response_length_non_aborted", kept))
        metrics["response_length_non_aborted/clip_ratio"] = float((kept == max_response_length).float().mean())
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = float((prompt_length == max_prompt_length).float().mean())
    if "__num_turns__" in batch.non_tensor_batch:
        turns = np.asarray(batch.non_tensor_batch["__num_turns__"], dtype=np.float64)
        metrics.update({f"num_turns/{stat}": float(getattr(turns, stat)()) for stat in ("min", "max", "mean")})
    if "tool_call_counts" in batch.non_tensor_batch:
        calls = np.array([c or 0 for c in batch.non_tensor_batch["tool_call_counts"]], dtype=np.float64)
        metrics.update({f"tool_call_counts/{stat}": float(getattr(calls, stat)()) for stat in ("min", "max", "mean")})
    return metrics


def _compute_response_info(batch: DataProto) -> dict[str, torch.Tensor]:
    """veRL's helper: ``prompt_length`` and ``response_length`` per sample (float) and the ``response_mask``.

    The response mask is the batch's ``response_mask`` when it has one (tool-observation tokens of agent loops are
    not generated, so they do not count), else the response part of ``attention_mask`` (veRL's reading).
    """
    b = batch.batch
    width = b["responses"].shape[-1]
    response_mask = b["response_mask"] if "response_mask" in b.keys() else b["attention_mask"][:, -width:]
    return {
        "response_mask": response_mask,
        "prompt_length": b["attention_mask"][:, :-width].sum(-1).float(),
        "response_length": response_mask.sum(-1).float(),
    }


def _token_counts(batch: DataProto) -> dict[str, int]:
    info = _compute_response_info(batch)
    response = int(info["response_length"].sum())
    prompt = int(info["prompt_length"].sum())
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
    (veRL's name, typo included.) The token count is the sum of ``meta_info["global_token_num"]`` (per-sample
    counts, as veRL's trainer records them) when the batch carries it, else the ones of ``attention_mask``."""
    global_token_num = batch.meta_info.get("global_token_num")
    if global_token_num is not None:
        total_tokens = int(sum(int(n) for n in global_token_num))
    else:
        total_tokens = int(batch.batch["attention_mask"].sum())
    step_time = float(timing_raw.get("step", 0.0))
    metrics = {"perf/total_num_tokens": float(total_tokens), "perf/time_per_step": step_time}
    if step_time > 0 and n_gpus > 0:
        metrics["perf/throughput"] = total_tokens / (step_time * n_gpus)
    return metrics


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[np.ndarray], float]],
    n_bootstrap: int = 1000,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """``(mean, std)`` over ``n_bootstrap`` resamples (with replacement) of ``subset_size`` items of ``data``, for
    each ``reduce_fn`` (applied to one resample, e.g. ``np.max``). The resamples depend only on ``seed``."""
    values = np.asarray(data)
    rng = np.random.default_rng(seed)
    samples = values[rng.integers(0, len(values), size=(n_bootstrap, subset_size))]
    out = []
    for reduce_fn in reduce_fns:
        stats = np.array([reduce_fn(row) for row in samples], dtype=np.float64)
        out.append((float(stats.mean()), float(stats.std())))
    return out


def calc_maj_val(data: Sequence[Mapping[str, Any]], vote_key: str, val_key: str) -> float:
    """The ``val_key`` of the majority ``vote_key`` among ``data`` (dicts); a tie goes to the prediction seen first,
    and the value is that of the first sample carrying the winning prediction."""
    counts: dict[Any, int] = {}
    first: dict[Any, float] = {}
    for item in data:
        vote = item[vote_key]
        counts[vote] = counts.get(vote, 0) + 1
        first.setdefault(vote, float(item[val_key]))
    winner = max(counts, key=lambda vote: counts[vote])  # dicts keep insertion order: ties → seen first
    return first[winner]


def _maj_of_resamples(values: np.ndarray, codes: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Majority vote in each resample (rows of ``index``), as :func:`calc_maj_val`: the value of the first sample
    whose prediction has the highest count (ties → the prediction seen first in the resample)."""
    picked = codes[index]  # (B, k) prediction codes
    counts = (picked[..., None] == np.arange(codes.max() + 1)).sum(axis=1)  # (B, n_codes)
    is_max = counts == counts.max(axis=1, keepdims=True)
    first = np.take_along_axis(is_max, picked, axis=1).argmax(axis=1)  # first position holding a top prediction
    return values[index[np.arange(len(index)), first]]


def _group_metrics(values: np.ndarray, preds: np.ndarray | None, n_bootstrap: int, seed: int) -> dict[str, float]:
    """``mean@N``, ``std@N`` and the bootstrapped ``best@K`` / ``worst@K`` / ``maj@K`` of one prompt's N samples."""
    n = len(values)
    metrics = {f"mean@{n}": float(values.mean())}
    if n == 1:
        return metrics
    metrics[f"std@{n}"] = float(values.std())
    sizes = [2**i for i in range(1, n.bit_length()) if 2**i < n] + [n]
    codes = None if preds is None else np.unique(preds, return_inverse=True)[1]
    for k in sizes:
        # the same resamples as bootstrap_metric(values, k, ..., n_bootstrap, seed)
        index = np.random.default_rng(seed).integers(0, n, size=(n_bootstrap, k))
        best, worst = values[index].max(axis=1), values[index].min(axis=1)
        metrics[f"best@{k}/mean"], metrics[f"best@{k}/std"] = float(best.mean()), float(best.std())
        metrics[f"worst@{k}/mean"], metrics[f"worst@{k}/std"] = float(worst.mean()), float(worst.std())
        if codes is not None:
            maj = _maj_of_resamples(values, codes, index)
            metrics[f"maj@{k}/mean"], metrics[f"maj@{k}/std"] = float(maj.mean()), float(maj.std())
    return metrics


def _is_number(value: Any) -> bool:
    return isinstance(value, bool | int | float | np.integer | np.floating | np.bool_)


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[str],
    infos_dict: Mapping[str, Sequence[Any]],
    seed: int = 42,
    n_bootstrap: int = 1000,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {var: {metric: value}}}``: per prompt (``sample_uids``), the statistics of its samples for
    every numeric variable of ``infos_dict`` (``reward``, ``acc``, …), averaged over the prompts of each source.

    Per prompt with N samples: ``mean@N``, ``std@N``, and for K in 2, 4, 8, … < N and N, over ``n_bootstrap``
    resamples of K samples: ``best@K/{mean,std}``, ``worst@K/{mean,std}``, and ``maj@K/{mean,std}`` (the variable
    of the majority ``pred``) when ``infos_dict`` has a ``pred`` list. Variables with a non-numeric value are
    skipped. Every list in ``infos_dict`` must have one entry per sample.
    """
    count = len(sample_uids)
    if len(data_sources) != count:
        raise ValueError(f"{len(data_sources)} data sources for {count} samples")
    for name, values in infos_dict.items():
        if len(values) != count:
            raise ValueError(f"validation info {name!r} has {len(values)} entries for {count} samples")
    preds = infos_dict.get("pred")
    variables = [name for name, values in infos_dict.items() if name != "pred" and all(map(_is_number, values))]
    rows: dict[tuple[str, str], list[int]] = defaultdict(list)
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids)):
        rows[(str(source), str(uid))].append(i)
    collected: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for (source, _), index in rows.items():
        group_preds = None if preds is None else np.array([str(preds[i]) for i in index], dtype=object)
        for name in variables:
            values = np.array([float(infos_dict[name][i]) for i in index], dtype=np.float64)
            for metric, value in _group_metrics(values, group_preds, n_bootstrap, seed).items():
                collected[(source, name, metric)].append(value)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (source, name, metric), values in collected.items():
        out.setdefault(source, {}).setdefault(name, {})[metric] = float(np.mean(values))
    return out
