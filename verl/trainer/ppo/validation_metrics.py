"""Validation statistics with veRL's names (re-exported by `verl.trainer.ppo.metric_utils`): per prompt, the
``mean@N`` / ``std@N`` of its N samples and the bootstrapped ``best@K`` / ``worst@K`` / ``maj@K``."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["bootstrap_metric", "calc_maj_val", "process_validation_metrics"]


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
