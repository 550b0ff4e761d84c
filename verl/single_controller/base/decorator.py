"""`@register`: how a worker method is dispatched to, executed on, and collected from a worker group.

A method decorated with ``@register(dispatch_mode=..., execute_mode=..., blocking=...)`` on a `Worker` becomes, on
the driver's `WorkerGroup`, a method that (1) splits or broadcasts its arguments over the ranks (dispatch),
(2) calls the ranks (execute: all of them, or rank 0), (3) waits unless ``blocking=False``, and (4) joins the
outputs (collect). Dispatch modes live in a registry: ``register_dispatch_mode`` adds one by name, and
``make_nd_compute_dataproto_dispatch_fn`` builds one per device mesh.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from verl.protocol import DataProto, DataProtoConfig, DataProtoFuture
from verl.utils.tensordict_import import TensorDict
from verl.utils.tensordict_utils import chunk_tensordict, concat_tensordict, pad_to_divisor

__all__ = [
    "MAGIC_ATTR",
    "PADDING_SIZE_KEY",
    "Dispatch",
    "DynamicEnum",
    "Execute",
    "get_predefined_dispatch_fn",
    "get_predefined_execute_fn",
    "make_nd_compute_dataproto_dispatch_fn",
    "SERVER_CONCURRENCY",
    "SERVER_GROUP",
    "register",
    "register_dispatch_mode",
    "server_method",
    "server_methods",
    "update_dispatch_mode",
]

MAGIC_ATTR = "_verl_register_attrs"  # attribute under which @register stores its settings on the function
PADDING_SIZE_KEY = "_verl_padding_size"  # kwarg a dispatch fn uses to tell the group how many rows it padded
SERVER_GROUP = "server"  # the Ray concurrency group of a worker's server methods (its own event loop thread)
SERVER_CONCURRENCY = 4096  # requests one worker serves at once (each in-flight request is one awaiting coroutine)
_SERVER_ATTR = "_verl_server_method"


def server_method(func: Callable) -> Callable:
    """Mark a worker method as a *server* method: called per request on one actor (not through the worker group's
    dispatch). An ``async`` one: each request in flight is an awaiting coroutine. Started by our worker groups
    (``remote_worker_class``), the actor runs them in its own concurrency group :data:`SERVER_GROUP` (their own
    event loop), so that requests are served while a registered method runs; in an actor a user made with a plain
    ``ray.remote(cls)`` they share the default group's loop, and still many are in flight at once."""
    setattr(func, _SERVER_ATTR, True)
    return func


def server_methods(cls: type) -> list[str]:
    """Names of the methods of ``cls`` marked with :func:`server_method`."""
    return [name for name in dir(cls) if getattr(getattr(cls, name, None), _SERVER_ATTR, False)]


class DynamicEnum:
    """An enum whose members can be added at run time (``Dispatch.register("MY_MODE")``)."""

    _registry: dict[str, DynamicEnum]
    _next_value: int

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._registry = {}
        cls._next_value = 0

    def __init__(self, name: str, value: int):
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __reduce__(self):  # unpickle to the registered singleton
        return (type(self).get, (self.name,))

    @classmethod
    def register(cls, name: str) -> DynamicEnum:
        """Add a member named ``name`` (an existing name is an error)."""
        if name in cls._registry:
            raise ValueError(f"{cls.__name__}.{name} is already registered")
        member = cls(name, cls._next_value)
        cls._next_value += 1
        cls._registry[name] = member
        setattr(cls, name, member)
        return member

    @classmethod
    def remove(cls, name: str) -> None:
        """Remove a member added with :meth:`register`."""
        member = cls._registry.pop(name)
        delattr(cls, member.name)

    @classmethod
    def get(cls, name: str) -> DynamicEnum:
        """The member named ``name``."""
        try:
            return cls._registry[name]
        except KeyError:
            raise ValueError(f"unknown {cls.__name__} {name!r}; known: {sorted(cls._registry)}") from None

    @classmethod
    def names(cls) -> list[str]:
        return list(cls._registry)


class Dispatch(DynamicEnum):
    """How arguments are sent to the ranks and outputs gathered back."""


class Execute(DynamicEnum):
    """Which ranks run the method: ``ALL`` or ``RANK_ZERO``."""


for _name in (
    "RANK_ZERO",
    "ONE_TO_ALL",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_PROTO",
    "DP_COMPUTE_PROTO_WITH_FUNC",
    "DP_COMPUTE_METRIC",
    "DIRECT_ROLLOUT_METHOD",
):
    Dispatch.register(_name)
for _name in ("ALL", "RANK_ZERO"):
    Execute.register(_name)


# ---------------------------------------------------------------------- dispatch / collect functions
def _group_label(worker_group) -> str:
    return getattr(worker_group, "name_prefix", None) or type(worker_group).__name__


def dispatch_one_to_all(worker_group, *args, **kwargs):
    """Every rank gets the same arguments."""
    n = worker_group.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(worker_group, *args, **kwargs):
    """Arguments pass through unchanged."""
    return args, kwargs


def collect_all_to_all(worker_group, output):
    return output


def dispatch_dp_compute(worker_group, *args, **kwargs):
    """Every argument is already a list with one entry per rank."""
    n = worker_group.world_size
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, list | tuple) or len(value) != n:
            raise ValueError(
                f"DP_COMPUTE on worker group {_group_label(worker_group)!r}: argument {name!r} must be a list of "
                f"{n} entries (one per rank), got {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, list | tuple) else "")
            )
    return args, kwargs


def collect_dp_compute(worker_group, output):
    if len(output) != worker_group.world_size:
        raise RuntimeError(f"expected {worker_group.world_size} outputs, got {len(output)}")
    return output


def _is_batch(value: Any) -> bool:
    return isinstance(value, DataProto) or (isinstance(value, TensorDict) and len(value.batch_size) > 0)


def _padding_enabled(value: DataProto | TensorDict) -> bool:
    return value.is_padding_enabled() if isinstance(value, DataProto) else DataProtoConfig.auto_padding


def _split_data(worker_group, chunks: int, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Chunk every DataProto / TensorDict / DataProtoFuture argument into ``chunks`` pieces along the rows (padding
    where enabled: a DataProto's own flag or ``DataProtoConfig.auto_padding``, the latter alone for a TensorDict);
    other arguments (and TensorDicts without a batch dimension) are broadcast. Adds ``PADDING_SIZE_KEY`` to kwargs
    when rows were padded."""
    batches = [v for v in [*args, *kwargs.values()] if _is_batch(v)]
    sizes = {len(v) for v in batches}
    if len(sizes) > 1:
        raise ValueError(f"batch arguments have different row counts {sorted(sizes)}; they cannot be split alike")
    pad = 0
    if sizes:
        rows = sizes.pop()
        if rows % chunks:
            enabled = all(_padding_enabled(v) for v in batches)
            if not enabled:
                raise ValueError(
                    f"a batch of {rows} rows does not divide among the {chunks} data-parallel ranks of worker group "
                    f"{_group_label(worker_group)!r}; make the batch size a multiple of {chunks} or enable "
                    "auto-padding (DataProto.from_dict(..., auto_padding=True) or DataProtoConfig.auto_padding)"
                )
            pad = chunks - rows % chunks

    def split(value):
        if isinstance(value, DataProto):
            if pad:
                value = DataProto(value.batch, dict(value.non_tensor_batch), dict(value.meta_info))
                value.padding(pad)
            return value.chunk(chunks)
        if _is_batch(value):  # a TensorDict
            if pad:
                value, _ = pad_to_divisor(value, chunks)
            return chunk_tensordict(value, chunks)
        if isinstance(value, DataProtoFuture):
            return value.chunk(chunks)
        return [value] * chunks

    out_args = tuple(split(a) for a in args)
    out_kwargs = {k: split(v) for k, v in kwargs.items()}
    if pad:
        out_kwargs[PADDING_SIZE_KEY] = pad
    return out_args, out_kwargs


def dispatch_dp_compute_data_proto(worker_group, *args, **kwargs):
    """DataProto arguments are chunked, one chunk per rank."""
    return _split_data(worker_group, worker_group.world_size, args, kwargs)


def dispatch_dp_compute_data_proto_with_func(worker_group, func, *args, **kwargs):
    """The first argument (a function) is broadcast; the DataProto arguments are chunked."""
    if not callable(func):
        raise TypeError(f"DP_COMPUTE_PROTO_WITH_FUNC expects a function as first argument, got {type(func).__name__}")
    split_args, split_kwargs = _split_data(worker_group, worker_group.world_size, args, kwargs)
    return ([func] * worker_group.world_size, *split_args), split_kwargs


def collect_dp_compute_data_proto(worker_group, output):
    """Concatenate the ranks' DataProtos or TensorDicts (or, when not yet fetched, build a DataProtoFuture over the
    refs)."""
    import ray

    if all(isinstance(o, ray.ObjectRef) for o in output):
        return DataProtoFuture.concat(output)
    kind = DataProto if output and isinstance(output[0], DataProto) else TensorDict
    for rank, o in enumerate(output):
        if not isinstance(o, kind):
            raise TypeError(
                f"rank {rank} of worker group {_group_label(worker_group)!r} returned "
                f"{type(o).__name__}, expected a DataProto or TensorDict like rank 0"
            )
    return DataProto.concat(list(output)) if kind is DataProto else concat_tensordict(list(output))


def dispatch_rank_zero(worker_group, *args, **kwargs):
    """Rank 0 alone is called, with the arguments unchanged."""
    return args, kwargs


def collect_rank_zero(worker_group, output):
    """Rank 0's output, unwrapped."""
    return output


def _direct_rollout_method(worker_group, *args, **kwargs):
    raise NotImplementedError("DIRECT_ROLLOUT_METHOD marks rollout-server methods; call them on the server directly")


_DISPATCH_MODE_FN_REGISTRY: dict[Dispatch, dict[str, Callable]] = {
    Dispatch.RANK_ZERO: {"dispatch_fn": dispatch_rank_zero, "collect_fn": collect_rank_zero},
    Dispatch.ONE_TO_ALL: {"dispatch_fn": dispatch_one_to_all, "collect_fn": collect_all_to_all},
    Dispatch.ALL_TO_ALL: {"dispatch_fn": dispatch_all_to_all, "collect_fn": collect_all_to_all},
    Dispatch.DP_COMPUTE: {"dispatch_fn": dispatch_dp_compute, "collect_fn": collect_dp_compute},
    Dispatch.DP_COMPUTE_PROTO: {
        "dispatch_fn": dispatch_dp_compute_data_proto,
        "collect_fn": collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: {
        "dispatch_fn": dispatch_dp_compute_data_proto_with_func,
        "collect_fn": collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_METRIC: {"dispatch_fn": dispatch_dp_compute_data_proto, "collect_fn": collect_dp_compute},
    Dispatch.DIRECT_ROLLOUT_METHOD: {"dispatch_fn": _direct_rollout_method, "collect_fn": _direct_rollout_method},
}


def get_predefined_dispatch_fn(dispatch_mode: Dispatch) -> dict[str, Callable]:
    """``{"dispatch_fn", "collect_fn"}`` for a registered dispatch mode."""
    if dispatch_mode not in _DISPATCH_MODE_FN_REGISTRY:
        raise ValueError(f"no dispatch functions registered for {dispatch_mode!r}")
    return _DISPATCH_MODE_FN_REGISTRY[dispatch_mode]


def register_dispatch_mode(dispatch_mode_name: str, dispatch_fn: Callable, collect_fn: Callable) -> Dispatch:
    """Add a dispatch mode ``Dispatch.<dispatch_mode_name>`` with its dispatch and collect functions."""
    mode = Dispatch.register(dispatch_mode_name)
    _DISPATCH_MODE_FN_REGISTRY[mode] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}
    return mode


def update_dispatch_mode(dispatch_mode: Dispatch, dispatch_fn: Callable, collect_fn: Callable) -> None:
    """Replace the functions of an existing dispatch mode."""
    if dispatch_mode not in _DISPATCH_MODE_FN_REGISTRY:
        raise ValueError(f"{dispatch_mode!r} is not registered; use register_dispatch_mode")
    _DISPATCH_MODE_FN_REGISTRY[dispatch_mode] = {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


def get_predefined_execute_fn(execute_mode: Execute) -> dict[str, str]:
    """The worker-group method name that executes a call in ``execute_mode``."""
    table = {Execute.ALL: "execute_all", Execute.RANK_ZERO: "execute_rank_zero"}
    if execute_mode not in table:
        raise ValueError(f"unknown execute mode {execute_mode!r}")
    return {"execute_fn_name": table[execute_mode]}


# ---------------------------------------------------------------------- n-d mesh dispatch
def _dispatch_info(worker_group, mesh_name: str) -> tuple[list[int], list[bool]]:
    """Per-rank (dp_rank, is_collect) under ``mesh_name``, asked of the workers once and cached on the group."""
    cache = worker_group.__dict__.setdefault("_dispatch_info", {})
    if mesh_name not in cache:
        dp_ranks = worker_group._query_dispatch_info(mesh_name)
        is_collect = worker_group._query_collect_info(mesh_name)
        cache[mesh_name] = (list(dp_ranks), list(is_collect))
    return cache[mesh_name]


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict[str, Callable]:
    """Dispatch/collect for a worker group laid out on a device mesh (dp × tp × pp ...).

    Each worker registers, under ``mesh_name``, its data-parallel rank and whether its output is collected
    (``Worker._register_dispatch_collect_info``). The data is chunked into ``dp_size`` pieces; worker ``i`` gets
    piece ``dp_rank[i]``; outputs of collecting workers are concatenated in dp order.
    """

    def dispatch_fn(worker_group, *args, **kwargs):
        dp_ranks, _ = _dispatch_info(worker_group, mesh_name)
        dp_size = max(dp_ranks) + 1
        split_args, split_kwargs = _split_data(worker_group, dp_size, args, kwargs)
        pad = split_kwargs.pop(PADDING_SIZE_KEY, 0)
        out_args = tuple([pieces[r] for r in dp_ranks] for pieces in split_args)
        out_kwargs = {k: [pieces[r] for r in dp_ranks] for k, pieces in split_kwargs.items()}
        if pad:
            out_kwargs[PADDING_SIZE_KEY] = pad
        return out_args, out_kwargs

    def collect_fn(worker_group, output):
        dp_ranks, is_collect = _dispatch_info(worker_group, mesh_name)
        picked = sorted((dp, out) for dp, out, keep in zip(dp_ranks, output, is_collect) if keep)
        return collect_dp_compute_data_proto(worker_group, [out for _, out in picked])

    return {"dispatch_fn": dispatch_fn, "collect_fn": collect_fn}


# ---------------------------------------------------------------------- the decorator
def _materialize(value: Any) -> Any:
    return value.get() if isinstance(value, DataProtoFuture) else value


def register(
    dispatch_mode: Dispatch | dict = Dispatch.ALL_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    materialize_futures: bool = True,
):
    """Mark a `Worker` method as callable from the driver through a `WorkerGroup`.

    Args:
        dispatch_mode: a `Dispatch` member, or a dict with ``dispatch_fn`` and ``collect_fn``.
        execute_mode: `Execute.ALL` (every rank) or `Execute.RANK_ZERO`.
        blocking: wait for and collect the results; when False the group method returns futures.
        materialize_futures: fetch `DataProtoFuture` arguments on the worker before calling the method.
    """
    if isinstance(dispatch_mode, dict):
        missing = {"dispatch_fn", "collect_fn"} - set(dispatch_mode)
        if missing:
            raise ValueError(f"a dispatch_mode dict needs keys dispatch_fn and collect_fn; missing {sorted(missing)}")
    elif not isinstance(dispatch_mode, Dispatch):
        raise TypeError(f"dispatch_mode must be a Dispatch member or a dict, got {dispatch_mode!r}")
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute member, got {execute_mode!r}")

    def decorator(func):
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def wrapper(*args, **kwargs):
                if materialize_futures:
                    args = tuple(_materialize(a) for a in args)
                    kwargs = {k: _materialize(v) for k, v in kwargs.items()}
                return await func(*args, **kwargs)

        else:

            @functools.wraps(func)
            def wrapper(*args, **kwargs):
                if materialize_futures:
                    args = tuple(_materialize(a) for a in args)
                    kwargs = {k: _materialize(v) for k, v in kwargs.items()}
                return func(*args, **kwargs)

        setattr(
            wrapper, MAGIC_ATTR, {"dispatch_mode": dispatch_mode, "execute_mode": execute_mode, "blocking": blocking}
        )
        return wrapper

    return decorator
