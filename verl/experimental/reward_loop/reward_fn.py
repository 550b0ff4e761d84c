"""A reward-loop manager as the run's reward function.

The trainer, validation and veRL's recipes call a reward function on a batch (``fn(data, return_dict=False)``); the
agent loops score each sample as it finishes. :class:`RewardLoopFunction` gives a reward-loop manager (one sample
at a time, ``await manager.run_single(data)``) both faces: :meth:`RewardLoopFunction.score_row` for one sample
and ``__call__`` for a batch, whose rows are scored concurrently. Every call of the manager runs on one event loop
of the function's own (a thread started on first use, in each process), so class-wide asyncio state — the
``rate_limited`` manager's limits — is only ever used from one loop.

A row whose ``run_single`` raises scores 0 and counts in ``reward/error_count``; one whose extra info says
``timeout: True`` counts in ``reward/timeout_count``. A batch on which every row failed raises
:class:`~verl.workers.reward_manager.abstract.RewardFunctionError` naming the manager: a judge that cannot score
anything stops the run instead of training it on zeros.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import traceback
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import torch

from verl.protocol import DataProto
from verl.workers.reward_manager.abstract import RewardFunctionError, align_extra_info

__all__ = ["RewardLoopFunction", "RowScore"]

logger = logging.getLogger(__name__)


@dataclass
class RowScore:
    """One sample's outcome: its score, extra info, and the failure that replaced them (if any)."""

    score: float
    extra: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None
    timed_out: bool = False


class RewardLoopFunction:
    """``manager`` (a :class:`~verl.experimental.reward_loop.reward_manager.base.RewardManagerBase`) as a reward
    function (see the module docstring).

    Args:
        manager: the reward-loop manager.
        reward_fn_key: the column naming each row's data source (``data.reward_fn_key``).
    """

    def __init__(self, manager: Any, reward_fn_key: str = "data_source") -> None:
        self.manager = manager
        self.reward_fn_key = reward_fn_key
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        """The manager's class, for messages."""
        cls = type(self.manager)
        return f"{cls.__module__}.{cls.__qualname__}"

    # ------------------------------------------------------------------ the manager's loop
    def _manager_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="reward-loop", daemon=True).start()
                self._loop = loop
            return self._loop

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        """Run ``coroutine`` on the manager's loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._manager_loop())

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        """``manager.run_single(data)`` on the manager's loop, awaited from any loop."""
        loop = self._manager_loop()
        if asyncio.get_running_loop() is loop:
            return await self.manager.run_single(data)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self.manager.run_single(data), loop))

    async def score_row(self, row: DataProto) -> RowScore:
        """One sample's :class:`RowScore` (a failure is caught and described, not raised)."""
        try:
            result = await self.run_single(row)
            score = float(result["reward_score"])
            extra = dict(result.get("reward_extra_info") or {})
        except Exception as error:  # noqa: BLE001 - any failure of the user's manager costs this sample only
            timed_out = isinstance(error, (TimeoutError, asyncio.TimeoutError))
            return RowScore(0.0, {}, "".join(traceback.format_exception(error)).strip(), timed_out)
        return RowScore(score, extra, None, bool(extra.get("timeout", False)))

    # ------------------------------------------------------------------ the batch call
    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """Score every row of ``data`` (concurrently); a batch a reward model already scored (``rm_scores``) is
        read, not scored again."""
        if data.batch is not None and "rm_scores" in data.batch.keys():
            extra = {k: list(data.non_tensor_batch[k]) for k in data.meta_info.get("reward_extra_keys", [])}
            tensor = data.batch["rm_scores"]
            return (
                {"reward_tensor": tensor, "reward_extra_info": extra, "reward_metrics": {}} if return_dict else tensor
            )

        async def score_all() -> list[RowScore]:
            return list(await asyncio.gather(*(self.score_row(data[i : i + 1]) for i in range(len(data)))))

        rows = self.submit(score_all()).result() if len(data) else []
        self.check(rows)
        tensor = self.manager.assemble_rm_scores(data, [r.score for r in rows]) if rows else torch.zeros(0)
        if not return_dict:
            return tensor
        errors = sum(r.failure is not None and not r.timed_out for r in rows)
        metrics = {"reward/error_count": errors, "reward/timeout_count": sum(r.timed_out for r in rows)}
        return {
            "reward_tensor": tensor,
            "reward_extra_info": align_extra_info([r.extra for r in rows]),
            "reward_metrics": metrics,
        }

    def check(self, rows: list[RowScore]) -> None:
        """Raise when every one of ``rows`` failed (see the module docstring); log each failure kind once."""
        failed = [r for r in rows if r.failure is not None or r.timed_out]
        for row in failed[:1]:
            logger.warning("reward manager %s failed on a sample: %s", self.describe(), row.failure or "timed out")
        if rows and len(failed) == len(rows):
            first = next((r.failure for r in failed if r.failure), "timed out")
            raise RewardFunctionError(
                f"the reward manager {self.describe()} failed on every one of the {len(rows)} samples of this "
                f"batch ({sum(r.timed_out for r in rows)} timed out); the first failure:\n{first}",
                timeouts=sum(r.timed_out for r in rows),
            )

    # ------------------------------------------------------------------ processes
    def __getstate__(self) -> dict[str, Any]:
        return {"manager": self.manager, "reward_fn_key": self.reward_fn_key}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["manager"], state["reward_fn_key"])
        type(self.manager).init_class(self.manager.config, self.manager.tokenizer)  # its class-wide state, here
