"""Backend-neutral parts of a worker group: resource pools, deferred constructors and method binding."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from verl.single_controller.base.decorator import (
    MAGIC_ATTR,
    PADDING_SIZE_KEY,
    Dispatch,
    Execute,
    get_predefined_dispatch_fn,
    get_predefined_execute_fn,
)

__all__ = ["ClassWithInitArgs", "ResourcePool", "WorkerGroup"]

logger = logging.getLogger(__name__)


class ResourcePool:
    """How many worker processes run on each node.

    Args:
        process_on_nodes: processes per node, e.g. ``[2, 2]`` for two nodes of two workers.
        max_colocate_count: how many worker groups may share one slot (one process each).
        n_gpus_per_node: devices per node (bookkeeping for GPU clusters).
    """

    def __init__(
        self, process_on_nodes: list[int] | None = None, max_colocate_count: int = 10, n_gpus_per_node: int = 8
    ) -> None:
        process_on_nodes = list(process_on_nodes or [])
        if any(int(n) < 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must be non-negative counts, got {process_on_nodes}")
        if max_colocate_count < 1:
            raise ValueError(f"max_colocate_count must be >= 1, got {max_colocate_count}")
        self._store = [int(n) for n in process_on_nodes]
        self.max_colocate_count = max_colocate_count
        self.n_gpus_per_node = n_gpus_per_node

    def add_node(self, process_count: int) -> None:
        self._store.append(int(process_count))

    @property
    def world_size(self) -> int:
        """Total number of worker processes."""
        return sum(self._store)

    def __call__(self) -> list[int]:
        return self._store

    @property
    def store(self) -> list[int]:
        return self._store

    def local_world_size_list(self) -> list[int]:
        """For each global rank, the number of processes on its node."""
        return [n for n in self._store for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        """For each global rank, its index on its node."""
        return [i for n in self._store for i in range(n)]


class ClassWithInitArgs:
    """A class and the arguments to construct it with, later (``cls_with_args()`` builds it)."""

    def __init__(self, cls: type, *args, **kwargs) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


class WorkerGroup:
    """A set of workers the driver calls as one: ``wg.method(data)`` dispatches, executes and collects.

    Subclasses provide ``execute_all_async`` / ``execute_rank_zero_async`` (returning futures) and ``_wait``.
    """

    def __init__(self, resource_pool: ResourcePool | None = None, **kwargs) -> None:
        self._is_init_with_detached_workers = resource_pool is None
        self._workers: list[Any] = []
        self._worker_names: list[str] = []
        self._dispatch_info: dict[str, Any] = {}
        self._bound_methods: set[str] = set()
        self.name_prefix: str = kwargs.get("name_prefix") or type(self).__name__

    @property
    def world_size(self) -> int:
        return len(self._workers)

    @property
    def workers(self) -> list[Any]:
        return self._workers

    @property
    def worker_names(self) -> list[str]:
        return self._worker_names

    # ------------------------------------------------------------------ to be provided by a backend
    def execute_all_async(self, method_name: str, *args, **kwargs) -> list[Any]:
        raise NotImplementedError

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs) -> Any:
        raise NotImplementedError

    def _wait(self, futures: Any, method_name: str, ranks: list[int]) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------------ binding
    def _bind_worker_method(self, user_defined_cls: type, func_generator: Callable | None = None) -> list[str]:
        """Give this group one method per ``@register``-ed method of ``user_defined_cls``; returns their names."""
        func_generator = func_generator or _make_group_method
        bound = []
        for name in dir(user_defined_cls):
            try:
                func = getattr(user_defined_cls, name)
            except AttributeError:
                continue
            attrs = getattr(func, MAGIC_ATTR, None)
            if not isinstance(attrs, dict):
                continue
            if hasattr(self, name) and name not in self._bound_methods:
                raise ValueError(
                    f"registered method {user_defined_cls.__name__}.{name} clashes with WorkerGroup.{name}; rename it"
                )
            dispatch_mode = attrs["dispatch_mode"]
            fns = dispatch_mode if isinstance(dispatch_mode, dict) else get_predefined_dispatch_fn(dispatch_mode)
            execute_mode = attrs["execute_mode"]
            if dispatch_mode is Dispatch.RANK_ZERO:  # RANK_ZERO dispatch always runs on rank 0 alone
                execute_mode = Execute.RANK_ZERO
            execute_name = get_predefined_execute_fn(execute_mode)["execute_fn_name"]
            method = func_generator(self, name, fns["dispatch_fn"], fns["collect_fn"], execute_name, attrs["blocking"])
            setattr(self, name, method)
            self._bound_methods.add(name)
            bound.append(name)
        return bound


def _make_group_method(
    worker_group: WorkerGroup,
    method_name: str,
    dispatch_fn: Callable,
    collect_fn: Callable,
    execute_fn_name: str,
    blocking: bool,
) -> Callable:
    """The driver-side method: dispatch → execute → (wait) → collect → strip padding rows."""

    def group_method(*args, **kwargs):
        args, kwargs = dispatch_fn(worker_group, *args, **kwargs)
        padding = kwargs.pop(PADDING_SIZE_KEY, 0)
        execute = getattr(worker_group, execute_fn_name + "_async")
        futures = execute(method_name, *args, **kwargs)
        if blocking:
            ranks = [0] if execute_fn_name == "execute_rank_zero" else list(range(len(futures)))
            futures = worker_group._wait(futures, method_name, ranks)
        output = collect_fn(worker_group, futures)
        if padding:
            output = _strip_padding(output, padding)
        return output

    group_method.__name__ = method_name
    return group_method


def _strip_padding(output: Any, padding: int) -> Any:
    from tensordict import TensorDict

    from verl.protocol import DataProto, DataProtoFuture, unpad_dataproto

    if isinstance(output, DataProto | TensorDict):
        return unpad_dataproto(output, padding)
    if isinstance(output, DataProtoFuture):
        return DataProtoFuture(output.collect_fn, output.futures, _Unpad(padding, output.dispatch_fn))
    return output  # per-rank lists (DP_COMPUTE_METRIC): padded rows cannot be told apart


class _Unpad:
    """Picklable ``lambda x: unpad_dataproto(previous(x), padding)``."""

    def __init__(self, padding: int, previous: Callable | None) -> None:
        self.padding, self.previous = padding, previous

    def __call__(self, data):
        from verl.protocol import unpad_dataproto

        if self.previous is not None:
            data = self.previous(data)
        return unpad_dataproto(data, self.padding)
