"""The Ray backend of the single controller: placement groups, worker groups of actors, fused roles.

``RayWorkerGroup(RayResourcePool([2]), RayClassWithInitArgs(ray.remote(MyWorker), cfg))`` starts two actors, one
per placement-group bundle, with the torch.distributed rendezvous variables set, and binds every ``@register``-ed
method of ``MyWorker`` onto the group. A dead actor or a failing method surfaces as an error naming the group, the
rank and the method.
"""

from __future__ import annotations

import inspect
import logging
import os
import uuid
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from verl.single_controller.base.decorator import MAGIC_ATTR
from verl.single_controller.base.worker import Worker, get_free_port, get_node_ip
from verl.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "WorkerDiedError",
    "create_colocated_worker_cls",
]

logger = logging.getLogger(__name__)

DEFAULT_PLACEMENT_GROUP_TIMEOUT_S = float(os.getenv("VERL_PLACEMENT_GROUP_TIMEOUT_S", "60"))


class WorkerDiedError(RuntimeError):
    """A worker process of a group died (killed, crashed, out of memory) while the driver waited on it."""


def cluster_has_gpus() -> bool:
    """True when the Ray cluster this driver is connected to has at least one GPU."""
    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0


class RayResourcePool(ResourcePool):
    """A `ResourcePool` backed by Ray placement groups: one group per node, one bundle per worker process.

    Bundles are ``{"CPU": 1}`` on a cluster without GPUs and ``{"CPU": 1, "GPU": 1}`` when ``use_gpu`` and the
    cluster has GPUs. Up to ``max_colocate_count`` worker groups may place one actor each on the same bundle; each
    such actor asks for ``1 / max_colocate_count`` of the bundle.

    Args:
        placement_group_timeout_s: how long to wait for the cluster to grant the bundles before raising an error
            that names the shortfall (env ``VERL_PLACEMENT_GROUP_TIMEOUT_S``, default 60).
    """

    def __init__(
        self,
        process_on_nodes: list[int] | None = None,
        use_gpu: bool = True,
        name_prefix: str | None = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        accelerator_type: str | None = None,
        placement_group_timeout_s: float | None = None,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or ""
        self.detached = detached
        self.accelerator_type = accelerator_type
        self.placement_group_timeout_s = (
            DEFAULT_PLACEMENT_GROUP_TIMEOUT_S if placement_group_timeout_s is None else placement_group_timeout_s
        )
        self.pgs: list[PlacementGroup] | None = None

    def uses_gpu(self) -> bool:
        """Whether bundles include a GPU (``use_gpu`` and the cluster has GPUs)."""
        return bool(self.use_gpu) and cluster_has_gpus()

    def bundle(self) -> dict[str, float]:
        bundle: dict[str, float] = {"CPU": 1}
        if self.uses_gpu():
            bundle["GPU"] = 1
            if self.accelerator_type:
                bundle[f"accelerator_type:{self.accelerator_type}"] = 1e-4
        return bundle

    def get_placement_groups(
        self, strategy: str = "STRICT_PACK", name: str | None = None, device_name: str | None = None
    ) -> list[PlacementGroup]:
        """Create (once) and return the placement groups, waiting at most ``placement_group_timeout_s``."""
        if self.pgs is not None:
            return self.pgs
        if not ray.is_initialized():
            raise RuntimeError("ray.init() must be called before creating placement groups")
        prefix = name or self.name_prefix or f"verl_pool_{uuid.uuid4().hex[:6]}"
        bundle = self.bundle()
        lifetime = "detached" if self.detached else None
        pgs = [
            placement_group(
                [dict(bundle) for _ in range(count)], strategy=strategy, name=f"{prefix}_{i}", lifetime=lifetime
            )
            for i, count in enumerate(self._store)
            if count > 0
        ]
        ready, _ = ray.wait([pg.ready() for pg in pgs], num_returns=len(pgs), timeout=self.placement_group_timeout_s)
        if len(ready) < len(pgs):
            for pg in pgs:
                remove_placement_group(pg)
            needed = {k: v * self.world_size for k, v in bundle.items()}
            raise RuntimeError(
                f"resource pool {prefix!r} could not get {self.world_size} bundles of {bundle} (needs {needed} in "
                f"{len(pgs)} node group(s) {self._store}) within {self.placement_group_timeout_s:.0f}s; the cluster "
                f"has {ray.cluster_resources()} in total and {ray.available_resources()} free. Start Ray with more "
                "logical CPUs (ray.init(num_cpus=...)) or ask for fewer workers"
            )
        self.pgs = pgs
        return pgs

    def release(self) -> None:
        """Remove the placement groups (after the worker groups on them are shut down)."""
        for pg in self.pgs or []:
            remove_placement_group(pg)
        self.pgs = None


class RayClassWithInitArgs(ClassWithInitArgs):
    """A Ray actor class and its constructor arguments; calling it starts one actor with the given options."""

    def __init__(self, cls: Any, *args, **kwargs) -> None:
        if not hasattr(cls, "__ray_actor_class__"):
            cls = ray.remote(cls)
        super().__init__(cls, *args, **kwargs)
        self._options: dict[str, Any] = {}
        self._additional_resource: dict[str, float] = {}

    @property
    def user_cls(self) -> type:
        """The plain Python class behind the Ray actor class."""
        return self.cls.__ray_actor_class__

    def set_additional_resource(self, additional_resource: dict[str, float]) -> None:
        self._additional_resource = dict(additional_resource)

    def update_options(self, options: dict[str, Any]) -> None:
        """Extra ``.options(...)`` for every actor (e.g. ``runtime_env``, ``max_concurrency``)."""
        self._options.update(options)

    def __call__(
        self,
        placement_group: PlacementGroup,
        placement_group_bundle_idx: int,
        use_gpu: bool = True,
        num_gpus: float = 1,
        num_cpus: float = 1,
        env_vars: dict[str, str] | None = None,
        name: str | None = None,
        detached: bool = False,
    ) -> Any:
        options: dict[str, Any] = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=placement_group, placement_group_bundle_index=placement_group_bundle_idx
            ),
            "num_cpus": num_cpus,
            "num_gpus": num_gpus if use_gpu else 0,
        }
        if self._additional_resource:
            options["resources"] = dict(self._additional_resource)
        options.update(self._options)
        runtime_env = dict(options.get("runtime_env") or {})
        runtime_env["env_vars"] = {**runtime_env.get("env_vars", {}), **(env_vars or {})}
        if not use_gpu:  # a CPU worker must not pick up a GPU of its node (trainer.device=cpu on a GPU cluster)
            runtime_env["env_vars"].setdefault("CUDA_VISIBLE_DEVICES", "")
        options["runtime_env"] = runtime_env
        if name:
            options["name"] = name
        if detached:
            options["lifetime"] = "detached"
        return self.cls.options(**options).remote(*self.args, **self.kwargs)


@ray.remote(num_cpus=0)
def _rendezvous_address() -> tuple[str, int]:
    return get_node_ip(), get_free_port()


def _rendezvous_on(pg: PlacementGroup) -> tuple[str, int]:
    """The IP of the node holding bundle 0 of ``pg`` and a free port there (for rank 0's process group)."""
    node_id = ray.util.placement_group_table(pg)["bundles_to_node_id"][0]
    strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    return ray.get(_rendezvous_address.options(scheduling_strategy=strategy).remote())


class RayWorkerGroup(WorkerGroup):
    """One Ray actor per bundle of a `RayResourcePool`, called as one through its ``@register``-ed methods.

    Args:
        resource_pool: where to start the actors (``None`` with ``worker_handles`` to wrap existing actors).
        ray_cls_with_init: the worker class and its constructor arguments.
        name_prefix: prefix of the actor names (random when not given); also names the group in errors.
        detached: start detached actors (they outlive the driver).
        worker_names / worker_handles: wrap existing actors instead of starting new ones.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: list[str] | None = None,
        worker_handles: list[Any] | None = None,
        **kwargs,
    ) -> None:
        name_prefix = name_prefix or f"wg_{uuid.uuid4().hex[:6]}"
        super().__init__(resource_pool=resource_pool, name_prefix=name_prefix)
        if ray_cls_with_init is None:
            raise ValueError("RayWorkerGroup needs ray_cls_with_init (the worker class and its arguments)")
        self.ray_cls_with_init = ray_cls_with_init
        self._detached = detached
        self.resource_pool = resource_pool
        if worker_handles is not None or worker_names is not None:
            if worker_handles is None:
                worker_handles = [ray.get_actor(n) for n in worker_names]
            self._workers = list(worker_handles)
            self._worker_names = list(worker_names or [f"{name_prefix}:{i}" for i in range(len(worker_handles))])
        else:
            if resource_pool is None:
                raise ValueError("RayWorkerGroup needs a resource_pool, or worker_handles/worker_names")
            self._start_workers(resource_pool, ray_cls_with_init)
        self._bind_worker_method(ray_cls_with_init.user_cls)

    def _start_workers(self, resource_pool: RayResourcePool, cls_with_init: RayClassWithInitArgs) -> None:
        pgs = resource_pool.get_placement_groups()
        use_gpu = resource_pool.uses_gpu()
        share = 1.0 / resource_pool.max_colocate_count
        world_size = resource_pool.world_size
        master_addr, master_port = _rendezvous_on(pgs[0])
        counts = [c for c in resource_pool.store if c > 0]
        rank = 0
        for pg_idx, (pg, local_world_size) in enumerate(zip(pgs, counts)):
            for local_rank in range(local_world_size):
                env_vars = {
                    "WORLD_SIZE": str(world_size),
                    "RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(local_world_size),
                    "RAY_LOCAL_WORLD_SIZE": str(local_world_size),
                    "LOCAL_RANK": str(local_rank),
                    "MASTER_ADDR": str(master_addr),
                    "MASTER_PORT": str(master_port),
                    "WG_PREFIX": self.name_prefix,
                    "WG_BACKEND": "ray",
                }
                name = f"{self.name_prefix}{cls_with_init.user_cls.__name__}_{pg_idx}:{local_rank}"
                actor = cls_with_init(
                    pg,
                    local_rank,
                    use_gpu=use_gpu,
                    num_gpus=share,
                    num_cpus=share,
                    env_vars=env_vars,
                    name=name,
                    detached=self._detached,
                )
                self._workers.append(actor)
                self._worker_names.append(name)
                rank += 1

    @classmethod
    def from_detached(
        cls,
        name_prefix: str | None = None,
        worker_names: list[str] | None = None,
        worker_handles: list[Any] | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
    ) -> RayWorkerGroup:
        """A group over existing (e.g. detached) actors, found by name or given as handles."""
        return cls(
            resource_pool=None,
            ray_cls_with_init=ray_cls_with_init,
            name_prefix=name_prefix,
            worker_names=worker_names,
            worker_handles=worker_handles,
        )

    def spawn(self, prefix_set: set[str] | list[str]) -> dict[str, RayWorkerGroup]:
        """For a group of fused roles (`create_colocated_worker_cls`), one group per role over the same actors,
        whose ``<role>_<method>`` methods are available as ``<method>``."""
        spawned = {}
        for prefix in prefix_set:
            group = RayWorkerGroup.from_detached(
                name_prefix=f"{self.name_prefix}{prefix}",
                worker_names=self._worker_names,
                worker_handles=self._workers,
                ray_cls_with_init=self.ray_cls_with_init,
            )
            start = prefix + "_"
            names = [n for n in group._bound_methods if n.startswith(start)]
            if not names:
                raise ValueError(f"no methods of role {prefix!r} on worker group {self.name_prefix!r}")
            for full in names:
                setattr(group, full[len(start) :], getattr(group, full))
            spawned[prefix] = group
        return spawned

    def fuse(self, prefix_set: set[str] | list[str]) -> None:
        """Attach the role groups of :meth:`spawn` to self as attributes (``wg.actor.update_actor(...)``)."""
        for prefix, group in self.spawn(prefix_set).items():
            setattr(self, prefix, group)

    def shutdown(self) -> None:
        """Kill this group's actors (roles spawned from it share them and go too)."""
        for worker in self._workers:
            ray.kill(worker, no_restart=True)
        self._workers = []

    # ------------------------------------------------------------------ execution
    def _call(self, index: int, method_name: str, *args, **kwargs) -> ray.ObjectRef:
        return getattr(self._workers[index], method_name).remote(*args, **kwargs)

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list[ray.ObjectRef]:
        """Call ``method_name`` on every rank. When every argument is a list with one entry per rank, rank ``i``
        gets entry ``i``; otherwise every rank gets the arguments as they are."""
        n = len(self._workers)
        values = [*args, *kwargs.values()]
        if values and all(isinstance(v, list) and len(v) == n for v in values):
            return [
                self._call(i, method_name, *(a[i] for a in args), **{k: v[i] for k, v in kwargs.items()})
                for i in range(n)
            ]
        return [self._call(i, method_name, *args, **kwargs) for i in range(n)]

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs) -> ray.ObjectRef:
        """Call ``method_name`` on rank 0 only."""
        return self._call(0, method_name, *args, **kwargs)

    execute_all = execute_all_async
    execute_rank_zero = execute_rank_zero_async

    def execute_all_sync(self, method_name: str, *args, **kwargs) -> list[Any]:
        return self._wait(
            self.execute_all_async(method_name, *args, **kwargs), method_name, list(range(len(self._workers)))
        )

    def execute_rank_zero_sync(self, method_name: str, *args, **kwargs) -> Any:
        return self._wait(self.execute_rank_zero_async(method_name, *args, **kwargs), method_name, [0])

    def _wait(self, futures: Any, method_name: str, ranks: list[int]) -> Any:
        """``ray.get`` that returns as soon as any rank fails, naming the group, rank and method."""
        single = not isinstance(futures, list)
        refs = [futures] if single else list(futures)
        position = {ref: i for i, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                i = position[ref]
                rank = ranks[i]
                try:
                    results[i] = ray.get(ref)
                except RayActorError as e:
                    raise WorkerDiedError(
                        f"worker group {self.name_prefix!r}: rank {rank} ({self._worker_names[rank]}) died while "
                        f"running {method_name!r}: {e}"
                    ) from e
                except RayTaskError as e:
                    if hasattr(e, "add_note"):
                        e.add_note(f"(worker group {self.name_prefix!r}, rank {rank}, method {method_name!r})")
                    raise
        return results[0] if single else results


def _role_method(role: str, name: str, func: Any) -> Any:
    """A method of the fused class forwarding to ``self.worker_dict[role].<name>``; keeps @register's settings."""
    if inspect.iscoroutinefunction(func):

        async def method(self, *args, **kwargs):
            return await getattr(self.worker_dict[role], name)(*args, **kwargs)

    else:

        def method(self, *args, **kwargs):
            return getattr(self.worker_dict[role], name)(*args, **kwargs)

    method.__name__ = f"{role}_{name}"
    setattr(method, MAGIC_ATTR, getattr(func, MAGIC_ATTR))
    return method


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """Fuse several roles into one actor class (they then share one process and its memory).

    The fused actor builds every role's worker in-process and exposes each registered method as
    ``<role>_<method>``; ``RayWorkerGroup.spawn`` gives one group per role with the plain method names.
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    roles = {role: (cia.user_cls, cia.args, cia.kwargs) for role, cia in class_dict.items()}

    def __init__(self):
        Worker.__init__(self)
        self.worker_dict = {role: cls(*args, **kwargs) for role, (cls, args, kwargs) in roles.items()}
        self.fused_worker_dict = self.worker_dict

    namespace: dict[str, Any] = {"__init__": __init__, "__module__": __name__}
    for role, (cls, _, _) in roles.items():
        for name in dir(cls):
            func = getattr(cls, name, None)
            if isinstance(getattr(func, MAGIC_ATTR, None), dict):
                namespace[f"{role}_{name}"] = _role_method(role, name, func)
    fused = type("WorkerDict_" + "_".join(roles), (Worker,), namespace)
    return RayClassWithInitArgs(ray.remote(fused))
