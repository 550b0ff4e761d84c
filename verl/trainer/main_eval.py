"""``python -m verl.trainer.main_eval [key=value ...]``: score generated responses offline, per data source.

Reads the parquet ``data.path`` (typically what ``verl.trainer.main_generation`` wrote): per row a list of responses
(column ``data.response_key``), a data source (``data.data_source_key``) and a ``{"ground_truth": ...}`` struct
(``data.reward_model_key``). Every response of every row is scored with
``compute_score(data_source, solution_str, ground_truth, extra_info)``: the function of
``custom_reward_function.path`` / ``.name`` (loaded as the trainer loads it, `get_custom_reward_fn`, with
``custom_reward_function.reward_kwargs``), else `default_compute_score`. ``extra_info`` is the row's ``extra_info``
column when there is one. A dict result contributes its ``"score"``.

Metrics, per data source ``ds`` (a row's scores are those of its responses):

- ``test_score/{ds}`` (veRL's): the mean over the rows of ``ds`` of the mean score of the row's responses;
- ``pass@1/{ds}``: the mean over the rows of the score of the row's first response (what one sample per prompt
  would score);
- ``mean@{n}/{ds}``: the mean over every response of the rows of ``ds`` (``n``: the most responses a row of ``ds``
  has; with the same number per row, as generation writes, it equals ``test_score/{ds}``).

Scoring runs in a local process pool (`RewardScorePool`, through the trainer's ``naive`` reward manager:
``reward_model.num_workers`` processes, ``reward_model.timeout_s`` per call), not in Ray: the work is a loop of
small Python calls. A call that raises, returns no finite score or times out scores 0 and is logged once per kind of
failure; when every response fails, `RewardFunctionError` names the function. The metrics are logged and printed as
a dict, as veRL prints them. See docs/generation_eval.md.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig, ListConfig, OmegaConf

from verl.trainer.config.compose import compose_config
from verl.trainer.config.validate import ConfigError, _walk

__all__ = [
    "compute_metrics",
    "evaluation_schema",
    "load_eval_data",
    "main",
    "run_eval",
    "score_responses",
    "validate_eval_config",
]

logger = logging.getLogger(__name__)

_COLUMN_KEYS = ("response_key", "data_source_key", "reward_model_key")


# ---------------------------------------------------------------------------------------------------------- config
def evaluation_schema() -> DictConfig:
    """The keys allowed and their defaults: ``evaluation.yaml`` composed (a fresh copy)."""
    return compose_config("evaluation")


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig | ListConfig) else node


def validate_eval_config(config: DictConfig, check_environment: bool = True) -> None:
    """Raise `ConfigError` listing every problem of ``config`` (a composed ``evaluation`` config): unknown keys and
    wrong types (against `evaluation_schema`), the column keys, the scoring pool's sizes and, with
    ``check_environment``, the data file and the custom reward file. ``ray_kwargs`` set away from the defaults logs
    a warning (nothing here runs in Ray)."""
    schema = evaluation_schema()
    problems: list[str] = []
    _walk(config, schema, "", problems)
    if problems:
        raise ConfigError(problems)
    cfg = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    data, reward_fn, scoring = cfg.data, cfg.custom_reward_function, cfg.reward_model
    for key in ("path", *_COLUMN_KEYS):
        if not isinstance(data[key], str) or not data[key]:
            problems.append(f"data.{key}={data[key]!r} must be a non-empty string")
    if check_environment and isinstance(data.path, str) and data.path:
        if not os.path.isfile(os.path.expanduser(data.path)):
            problems.append(f"data.path={data.path!r}: no such file; give the parquet file of the responses")
    if reward_fn.path is not None:
        if not isinstance(reward_fn.path, str) or not reward_fn.path:
            problems.append(f"custom_reward_function.path={reward_fn.path!r} must be null or a Python file")
        elif check_environment and not os.path.isfile(os.path.expanduser(reward_fn.path)):
            problems.append(f"custom_reward_function.path={reward_fn.path!r}: no such file")
    workers = scoring.num_workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        problems.append(f"reward_model.num_workers={workers!r} must be an integer >= 0 (0: score in threads)")
    timeout = scoring.timeout_s
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)):
        problems.append(f"reward_model.timeout_s={timeout!r} must be a number of seconds or null")
    defaults = _plain(schema.ray_kwargs)
    if _plain(cfg.ray_kwargs) != defaults:
        logger.warning("ray_kwargs has no effect here: scoring runs in a local process pool, not in Ray")
    if problems:
        raise ConfigError(problems)


# ---------------------------------------------------------------------------------------------------------- data
def load_eval_data(config: DictConfig) -> Any:
    """The ``data.path`` parquet as a pandas DataFrame; a column a ``data.*_key`` names but the file lacks is an
    error naming both."""
    import pandas as pd

    path = os.path.expanduser(config.data.path)
    frame = pd.read_parquet(path)
    missing = [f"{config.data[key]!r} (data.{key})" for key in _COLUMN_KEYS if config.data[key] not in frame.columns]
    if missing:
        raise ValueError(f"data file {path!r} has no column {', '.join(missing)}; its columns: {list(frame.columns)}")
    return frame


def _responses(value: Any, row: int, column: str) -> list[str]:
    """A row's responses: a list (or array) of strings; a lone string counts as one response."""
    if isinstance(value, str):
        return [value]
    items = list(value) if isinstance(value, list | tuple | np.ndarray) else None
    if not items or not all(isinstance(item, str) for item in items):
        raise ValueError(f"row {row}: column {column!r} (data.response_key) must hold a non-empty list of strings")
    return items


def _ground_truth(value: Any) -> Any:
    return value.get("ground_truth") if isinstance(value, Mapping) else None


# ---------------------------------------------------------------------------------------------------------- scoring
def score_responses(config: DictConfig, frame: Any) -> list[list[float]]:
    """The score of every response of every row of ``frame``, per row (failed calls score 0). Raises
    `RewardFunctionError` naming the function when every call fails."""
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.workers.reward_manager import NaiveRewardManager
    from verl.workers.reward_manager.abstract import RewardFunctionError, RewardSample, describe_function

    data = config.data
    column = data.response_key
    extra_infos = frame["extra_info"].tolist() if "extra_info" in frame.columns else [None] * len(frame)
    rows = zip(frame[column], frame[data.data_source_key], frame[data.reward_model_key], extra_infos)
    samples, counts = [], []
    for row, (responses, data_source, reward_model, extra_info) in enumerate(rows):
        responses = _responses(responses, row, column)
        counts.append(len(responses))
        for response in responses:
            extra = dict(extra_info) if isinstance(extra_info, Mapping) else {}
            truth = _ground_truth(reward_model)
            samples.append(RewardSample(len(samples), data_source, "", response, truth, extra, 0))
    scoring = config.reward_model
    manager = NaiveRewardManager(
        tokenizer=None,
        compute_score=get_custom_reward_fn(config),
        timeout_s=scoring.timeout_s,
        num_workers=scoring.num_workers,
    )
    try:
        scored = manager.score(samples)
    finally:
        manager.close()
    failed = scored.errors + scored.timeouts
    if samples and failed == len(samples):
        raise RewardFunctionError(
            f"the reward function {describe_function(manager.compute_score)} failed on every one of the "
            f"{len(samples)} responses of {data.path} ({scored.timeouts} timed out); the first failure:\n"
            f"{scored.first_failure}"
        )
    if failed:
        logger.warning("%d of %d responses could not be scored (they score 0)", failed, len(samples))
    out, start = [], 0
    for count in counts:
        out.append(scored.scores[start : start + count])
        start += count
    return out


def compute_metrics(data_sources: list[Any], scores: list[list[float]]) -> dict[str, float]:
    """``test_score/{ds}``, ``pass@1/{ds}`` and ``mean@{n}/{ds}`` of each data source (module docstring)."""
    by_source: dict[Any, list[list[float]]] = defaultdict(list)
    for data_source, row in zip(data_sources, scores, strict=True):
        by_source[data_source].append(row)
    metrics: dict[str, float] = {}
    for data_source in sorted(by_source, key=str):
        rows = by_source[data_source]
        metrics[f"test_score/{data_source}"] = float(np.mean([np.mean(row) for row in rows]))
    for data_source in sorted(by_source, key=str):
        rows = by_source[data_source]
        metrics[f"pass@1/{data_source}"] = float(np.mean([row[0] for row in rows]))
        n = max(len(row) for row in rows)
        metrics[f"mean@{n}/{data_source}"] = float(np.mean([score for row in rows for score in row]))
    return metrics


def run_eval(config: DictConfig) -> dict[str, float]:
    """Validate ``config``, score ``data.path`` and return the metrics (see the module docstring)."""
    validate_eval_config(config)
    config = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
    frame = load_eval_data(config)
    scores = score_responses(config, frame)
    return compute_metrics(frame[config.data.data_source_key].tolist(), scores)


@hydra.main(config_path="config", config_name="evaluation", version_base=None)
def main(config: DictConfig) -> None:
    """The command-line entry point: logs the metrics and writes them as one dict on stdout, the command's result
    (as veRL's main_eval prints it)."""
    metrics = run_eval(config)
    logger.info("evaluation: %s", metrics)
    sys.stdout.write(f"{metrics}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
