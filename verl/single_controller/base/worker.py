"""`Worker`: the base class of every process a `WorkerGroup` drives.

The worker group starts each worker with ``WORLD_SIZE``, ``RANK``, ``LOCAL_WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` in its environment, so ``torch.distributed.init_process_group()`` works inside
it with no arguments (gloo on CPU, nccl on GPU). Rank 0 picks the rendezvous address and a free port itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from verl.single_controller.base.decorator import Dispatch, Execute, register
from verl.utils.net_utils import get_free_port, get_node_ip

__all__ = ["Worker", "get_free_port", "get_node_ip"]


class Worker:
    """Base class of a worker process: knows its rank and world size and answers dispatch queries.

    Subclasses call ``super().__init__()`` and decorate driver-callable methods with ``@register``.
    """

    def __init__(self, cuda_visible_devices: str | None = None) -> None:
        env = os.environ
        self._world_size = int(env.get("WORLD_SIZE", "1"))
        self._rank = int(env.get("RANK", "0"))
        self._local_world_size = int(env.get("LOCAL_WORLD_SIZE", str(self._world_size)))
        self._local_rank = int(env.get("LOCAL_RANK", str(self._rank)))
        if self._rank == 0 and "MASTER_ADDR" not in env:
            env["MASTER_ADDR"] = get_node_ip()
            env["MASTER_PORT"] = str(get_free_port())
        self._master_addr = env.get("MASTER_ADDR")
        self._master_port = env.get("MASTER_PORT")
        if cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        self._dispatch_dp_rank: dict[str, int] = {}
        self._collect_mask: dict[str, bool] = {}
        self.fused_worker_dict: dict[str, Worker] = {}

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        return self._local_rank

    @property
    def local_world_size(self) -> int:
        return self._local_world_size

    def get_master_addr_port(self) -> tuple[str | None, str | None]:
        """The rendezvous address and port this worker's process group uses."""
        return self._master_addr, self._master_port

    def get_cuda_visible_devices(self) -> str:
        return os.environ.get("CUDA_VISIBLE_DEVICES", "not set")

    def get_node_ip_and_pid(self) -> tuple[str, int]:
        return get_node_ip(), os.getpid()

    # ------------------------------------------------------------------ n-d dispatch info
    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Declare this worker's data-parallel rank under ``mesh_name`` and whether its output is collected."""
        if mesh_name in self._dispatch_dp_rank:
            raise ValueError(f"mesh {mesh_name!r} is already registered on rank {self.rank}")
        self._dispatch_dp_rank[mesh_name] = int(dp_rank)
        self._collect_mask[mesh_name] = bool(is_collect)

    def get_dispatch_collect(self) -> dict[str, dict[str, Any]]:
        """This worker's registered meshes: ``{"dispatch_dp_rank": {mesh: dp_rank}, "collect_dp_rank": {mesh: bool}}``,
        the keyword arguments of another worker's `set_dispatch_collect`."""
        return {"dispatch_dp_rank": dict(self._dispatch_dp_rank), "collect_dp_rank": dict(self._collect_mask)}

    def set_dispatch_collect(
        self, mesh_name: str, dispatch_dp_rank: dict[str, int], collect_dp_rank: dict[str, bool]
    ) -> None:
        """Register under ``mesh_name`` the dispatch rank and collect flag of another worker (a fused worker taking
        over a role's info, from that role's `get_dispatch_collect`). The other worker's meshes must agree on both.

        Raises AssertionError (as veRL does) when ``mesh_name`` is already registered here."""
        if mesh_name in self._dispatch_dp_rank or mesh_name in self._collect_mask:
            raise AssertionError(f"mesh {mesh_name!r} is already registered on rank {self.rank}")
        ranks, collects = set(dispatch_dp_rank.values()), set(collect_dp_rank.values())
        if len(ranks) != 1 or len(collects) != 1:
            raise ValueError(
                f"set_dispatch_collect({mesh_name!r}): the other worker must register one dp rank and one collect "
                f"flag, got dispatch_dp_rank={dispatch_dp_rank}, collect_dp_rank={collect_dp_rank}"
            )
        self._register_dispatch_collect_info(mesh_name, ranks.pop(), collects.pop())

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        if mesh_name not in self._dispatch_dp_rank:
            raise ValueError(
                f"rank {self.rank} has not registered mesh {mesh_name!r}; known: {sorted(self._dispatch_dp_rank)}"
            )
        return self._dispatch_dp_rank[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        if mesh_name not in self._collect_mask:
            raise ValueError(f"rank {self.rank} has not registered mesh {mesh_name!r}")
        return self._collect_mask[mesh_name]

    # ------------------------------------------------------------------ generic execution
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func: Callable, *args, **kwargs) -> Any:
        """Run ``func(self, *args, **kwargs)`` on each rank with that rank's chunk of the data."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.RANK_ZERO, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func: Callable, *args, **kwargs) -> Any:
        """Run ``func(*args, **kwargs)`` on rank 0."""
        return func(*args, **kwargs)
