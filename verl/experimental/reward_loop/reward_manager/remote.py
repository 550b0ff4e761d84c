"""``remote``: ``compute_score`` in ``reward.num_workers`` separate Ray processes (veRL 0.10's manager of that
name), for CPU-heavy checks that would hold up the agent loops' process (or that misbehave in its threads).

The workers are started by the manager, round-robin over its calls, on the manager's node. The function must be
synchronous (an async one is refused when the manager is built) and picklable (a file's function is: it is
re-imported in the worker).
"""

from __future__ import annotations

import itertools
from typing import Any

from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase, is_async_function, score_result
from verl.experimental.reward_loop.reward_manager.registry import register
from verl.protocol import DataProto
from verl.utils.py_functional import accepted_kwargs

__all__ = ["RemoteRewardManager", "RewardComputeWorker"]


class RewardComputeWorker:
    """A process that runs the scoring function (a Ray actor of :class:`RemoteRewardManager`)."""

    def __init__(self, compute_score: Any) -> None:
        self.compute_score = compute_score

    def compute_score_call(self, kwargs: dict[str, Any]) -> Any:
        """``compute_score(**kwargs)`` with the keywords it declares."""
        return self.compute_score(**accepted_kwargs(self.compute_score, kwargs))


@register("remote")
class RemoteRewardManager(RewardManagerBase):
    """Scores each sample in one of ``reward.num_workers`` Ray worker processes (see the module docstring)."""

    def setup(self) -> None:
        """Start the worker processes."""
        import ray

        from verl.utils.reward_score import default_compute_score

        fn = self.compute_score or default_compute_score
        if is_async_function(fn):
            raise TypeError("reward.reward_manager.name=remote: compute_score is async; use naive or rate_limited")
        count = int(self.reward_section().get("num_workers", 1) or 1)
        node = ray.get_runtime_context().get_node_id()
        affinity = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(node_id=node, soft=True)
        worker_cls = ray.remote(num_cpus=0)(RewardComputeWorker)
        self.workers = [worker_cls.options(scheduling_strategy=affinity).remote(fn) for _ in range(count)]
        self._next = itertools.cycle(self.workers)

    async def run_single(self, data: DataProto) -> dict[str, Any]:
        """Score the last row in the next worker process."""
        inputs = self.sample(data)
        kwargs = {
            "data_source": inputs.data_source,
            "solution_str": inputs.solution_str,
            "ground_truth": inputs.ground_truth,
            "extra_info": inputs.extra_info,
            **self.router_kwargs(),
        }
        return score_result(await next(self._next).compute_score_call.remote(kwargs), "compute_score")
