"""``prime``: PRIME's reward manager (Cui et al., 2025, "Process Reinforcement through Implicit Rewards",
arXiv:2502.01456): every sample scored in parallel, with a per-sample time limit, and the scores kept as ``acc``.

As in veRL, ``compute_score`` is called positionally as ``compute_score(data_source, solution_str, ground_truth,
extra_info)`` (plus the ``reward_kwargs`` it declares); a number or bool is the score, a tuple or list scores its
first element (``prime_code.compute_score`` returns ``(success, metadata)``), a dict its ``"score"``. The calls run
in the manager's scoring processes (:class:`~verl.utils.reward_score.pool.RewardScorePool`): ``num_workers`` of
them (default: one per core, at most 64, veRL's pool size), each call cut at ``timeout_s`` (default 300 s, veRL's)
by killing its process. A call that fails or times out scores 0 and is counted, as everywhere here; if every sample
of a batch fails, the manager raises instead of training on zeros (veRL would score them all 0).

After a call, ``data.batch["acc"]`` holds each sample's score (float32, one per row), which PRIME's implicit
reward model and its ``reward_gt_coef`` read; :meth:`PrimeRewardManager.verify` returns the same scores as a list.

veRL's module-level helpers are here too: :func:`parallel_compute_score_async` / :func:`run_reward_scoring` score
lists of completions in the same kind of process pool (a failed or timed-out call scores 0, as in veRL).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from verl.protocol import DataProto
from verl.utils.reward_score.pool import RewardScorePool, ScoreResult
from verl.workers.reward_manager.abstract import AbstractRewardManager, RewardSample, ScoredBatch
from verl.workers.reward_manager.registry import register

__all__ = [
    "DEFAULT_NUM_WORKERS",
    "DEFAULT_TIMEOUT_S",
    "PrimeRewardManager",
    "parallel_compute_score_async",
    "run_reward_scoring",
]

DEFAULT_TIMEOUT_S = 300.0
DEFAULT_NUM_WORKERS = min(64, os.cpu_count() or 1)


def _first_if_sequence(result: ScoreResult) -> ScoreResult:
    """veRL's reading of a result: a tuple or list scores its first element, a bool as 0/1."""
    value = result.value
    if result.ok and isinstance(value, (tuple, list)):
        if not value:
            return ScoreResult(error="compute_score returned an empty sequence; expected (score, ...)")
        value = value[0]
    if result.ok and isinstance(value, bool):
        value = float(value)
    return ScoreResult(value=value, error=result.error, timed_out=result.timed_out)


@register("prime")
class PrimeRewardManager(AbstractRewardManager):
    """PRIME's manager; see the module docstring."""

    def __init__(
        self,
        tokenizer: Any,
        num_examine: int,
        compute_score: Callable[..., Any] | None = None,
        reward_fn_key: str = "data_source",
        *,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        num_workers: int | None = None,
        **reward_kwargs: Any,
    ) -> None:
        workers = DEFAULT_NUM_WORKERS if num_workers is None else num_workers
        super().__init__(
            tokenizer, num_examine, compute_score, reward_fn_key, timeout_s=timeout_s, num_workers=workers,
            **reward_kwargs,
        )  # fmt: skip

    def score(self, samples: list[RewardSample]) -> ScoredBatch:
        """One positional ``compute_score`` call per sample, all in the scoring processes at once."""
        kwargs = self.score_kwargs({})
        calls = [((s.data_source, s.response_str, s.ground_truth, s.extra_info), kwargs) for s in samples]
        results = [_first_if_sequence(result) for result in self.pool.run(calls)]
        scored = self.check_results(samples, results)
        for extra, value in zip(scored.extra, scored.scores):
            extra.setdefault("acc", value)
        return scored

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """The reward tensor (or veRL's dict); also sets ``data.batch["acc"]`` unless a reward model scored."""
        if data.batch is not None and "rm_scores" in data.batch.keys():
            return super().__call__(data, return_dict)
        out = super().__call__(data, return_dict=True)
        assert isinstance(out, dict)
        reward_tensor = out["reward_tensor"]
        device = data.batch["responses"].device
        data.batch["acc"] = reward_tensor.sum(dim=-1).to(device=device, dtype=torch.float32)  # one score per row
        return out if return_dict else reward_tensor

    def verify(self, data: DataProto) -> list[float]:
        """Score the batch, store the scores as ``data.batch["acc"]`` and return them."""
        self(data)
        return data.batch["acc"].tolist()


def _score_lists(
    evaluation_func: Callable[..., Any],
    completions: Sequence[str],
    references: Sequence[Any],
    tasks: Sequence[str],
    extra_info: Sequence[Any] | None,
    num_processes: int,
) -> list[float]:
    extra_info = [None] * len(tasks) if extra_info is None else extra_info
    calls = [
        ((task, completion, reference, extra), {})
        for completion, reference, task, extra in zip(completions, references, tasks, extra_info, strict=True)
    ]
    with RewardScorePool(
        evaluation_func, num_workers=min(num_processes, len(calls)) or 1, timeout_s=DEFAULT_TIMEOUT_S
    ) as pool:
        results = [_first_if_sequence(result) for result in pool.run(calls)]
    return [float(r.value) if r.ok and isinstance(r.value, int | float) else 0.0 for r in results]


async def parallel_compute_score_async(
    evaluation_func: Callable[..., Any],
    completions: Sequence[str],
    references: Sequence[Any],
    tasks: Sequence[str],
    extra_info: Sequence[Any] | None = None,
    num_processes: int = 64,
) -> list[float]:
    """veRL's helper: ``evaluation_func(task, completion, reference, extra_info)`` for each row, in up to
    ``num_processes`` scoring processes (each call cut at 300 s); a failed or timed-out call scores 0, a sequence
    result scores its first element."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        None, _score_lists, evaluation_func, completions, references, tasks, extra_info, num_processes
    )


def run_reward_scoring(
    evaluation_func: Callable[..., Any],
    completions: Sequence[str],
    references: Sequence[Any],
    tasks: Sequence[str],
    extra_info: Sequence[Any] | None = None,
    num_processes: int = 64,
) -> list[float]:
    """:func:`parallel_compute_score_async` from synchronous code."""
    return _score_lists(evaluation_func, completions, references, tasks, extra_info, num_processes)
