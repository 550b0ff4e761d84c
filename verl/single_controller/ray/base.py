"""The Ray backend of the single controller: placement groups, worker groups of actors, fused roles.

``RayWorkerGroup(RayResourcePool([2]), RayClassWithInitArgs(ray.remote(MyWorker), cfg))`` starts two actors, one
per placement-group bundle, with the torch.distributed rendezvous variables set, and binds every ``@register``-ed
method of ``MyWorker`` onto the group. A dead actor or a failing method surfaces as an error naming the group, the
rank and the method.

``split_resource_pool(pool, 2)`` gives `SubRayResourcePool` views over consecutive bundles of one pool (each its own
worker group, e.g. one rollout replica per pair of bundles); ``merge_resource_pool`` joins two pools into one.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from verl.single_controller.base.worker_group import ClassWithInitArgs, ResourcePool, WorkerGroup
from verl.utils.net_utils import node_ip_and_free_port

__all__ = [
    "FusedWorkerCLSName",
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "SubRayResourcePool",
    "WorkerDiedError",
    "create_colocated_worker_cls",
    "create_colocated_worker_raw_cls",
    "merge_resource_pool",
    "remote_worker_class",
    "split_resource_pool",
]

logger = logging.getLogger(__name__)

# The environment variables a worker group sets for each of its actors (``worker_env`` may not override them).
GROUP_ENV_VARS = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_WORLD_SIZE",
    "RAY_LOCAL_WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WG_PREFIX",
    "WG_BACKEND",
)
DEFAULT_PLACEMENT_GROUP_TIMEOUT_S = float(os.getenv("VERL_PLACEMENT_GROUP_TIMEOUT_S", "60"))
# how long a failed collective call waits for the other ranks, to name one that died as the cause
PEER_DEATH_WAIT_S = 10.0


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
        custom_resources: dict[str, float] | None = None,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        self.custom_resources = {str(k): float(v) for k, v in (custom_resources or {}).items()}
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix or ""
        self.detached = detached
        self.accelerator_type = accelerator_type
        self.placement_group_timeout_s = (
            DEFAULT_PLACEMENT_GROUP_TIMEOUT_S if placement_group_timeout_s is None else placement_group_timeout_s
        )
        self.pgs: list[PlacementGroup] | None = None
        self._slots: list[tuple[PlacementGroup, int]] | None = None  # set for a merged pool
        self._owns_pgs = True  # False for views (split / merged pools): release() leaves the groups alone

    def uses_gpu(self) -> bool:
        """Whether bundles include a GPU (``use_gpu`` and the cluster has GPUs)."""
        return bool(self.use_gpu) and cluster_has_gpus()

    def bundle(self) -> dict[str, float]:
        bundle: dict[str, float] = {"CPU": 1}
        if self.uses_gpu():
            bundle["GPU"] = 1
            if self.accelerator_type:
                bundle[f"accelerator_type:{self.accelerator_type}"] = 1e-4
        bundle.update(self.custom_resources)  # node resources that place the pool (ray start --resources=...)
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

    def bundle_slots(self) -> list[tuple[PlacementGroup, int]]:
        """``(placement group, bundle index)`` of each rank, in rank order (creates the groups if needed)."""
        if self._slots is not None:
            return list(self._slots)
        pgs = self.get_placement_groups()
        counts = [c for c in self._store if c > 0]
        return [(pg, i) for pg, count in zip(pgs, counts) for i in range(count)]

    def release(self) -> None:
        """Remove the placement groups (after the worker groups on them are shut down). A split or merged pool does
        not own its groups: releasing it does nothing; release the pools it was made from."""
        if not self._owns_pgs:
            return
        for pg in self.pgs or []:
            remove_placement_group(pg)
        self.pgs = None


class SubRayResourcePool(RayResourcePool):
    """The ranks ``start_bundle_index .. start_bundle_index + subgroup_world_size - 1`` of a pool whose placement
    groups are ``placement_groups`` (made by :func:`split_resource_pool`; ``process_on_nodes`` is the full
    pool's). A view: it does not own the placement groups."""

    def __init__(
        self,
        placement_groups: list[PlacementGroup],
        start_bundle_index: int,
        subgroup_world_size: int,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        total = sum(self._store)
        start, size = int(start_bundle_index), int(subgroup_world_size)
        if start < 0 or size < 1 or start + size > total:
            raise ValueError(
                f"SubRayResourcePool: ranks [{start}, {start + size}) are outside the pool's {total} bundles"
            )
        self.pgs = list(placement_groups)
        self.start_bundle_index = start
        self.subgroup_world_size = size
        self._owns_pgs = False

    @property
    def world_size(self) -> int:
        return self.subgroup_world_size

    def bundle_slots(self) -> list[tuple[PlacementGroup, int]]:
        counts = [c for c in self._store if c > 0]
        slots = [(pg, i) for pg, count in zip(self.pgs, counts) for i in range(count)]
        return slots[self.start_bundle_index : self.start_bundle_index + self.subgroup_world_size]

    def local_world_size_list(self) -> list[int]:
        return [n for n, _ in _local_layout(self.bundle_slots())]

    def local_rank_list(self) -> list[int]:
        return [i for _, i in _local_layout(self.bundle_slots())]


def _local_layout(slots: list[tuple[PlacementGroup, int]]) -> list[tuple[int, int]]:
    """For each rank: (ranks of the same placement group — one node —, index among them)."""
    per_pg: dict[Any, int] = {}
    for pg, _ in slots:
        per_pg[pg.id] = per_pg.get(pg.id, 0) + 1
    seen: dict[Any, int] = {}
    layout = []
    for pg, _ in slots:
        layout.append((per_pg[pg.id], seen.get(pg.id, 0)))
        seen[pg.id] = seen.get(pg.id, 0) + 1
    return layout


def split_resource_pool(resource_pool: RayResourcePool, split_size: int | list[int]) -> list[SubRayResourcePool]:
    """Split a pool (or a split of one) into consecutive `SubRayResourcePool` views.

    ``split_size``: an int (every view that size; must divide the pool's world size) or a list of sizes summing to
    it. The pool's placement groups are created now; the views share them.
    """
    world = resource_pool.world_size
    if isinstance(split_size, int):
        if split_size < 1 or world % split_size:
            raise ValueError(f"split_size={split_size} must be a positive divisor of the pool's world size {world}")
        sizes = [split_size] * (world // split_size)
    else:
        sizes = [int(n) for n in split_size]
        if any(n < 1 for n in sizes) or sum(sizes) != world:
            raise ValueError(f"split_size={list(split_size)} must be positive sizes summing to the world size {world}")
    if resource_pool._slots is not None:
        raise ValueError("split_resource_pool: a merged pool cannot be split; split the pools before merging them")
    pgs = resource_pool.get_placement_groups()
    start = resource_pool.start_bundle_index if isinstance(resource_pool, SubRayResourcePool) else 0
    views = []
    for i, size in enumerate(sizes):
        views.append(
            SubRayResourcePool(
                placement_groups=pgs,
                start_bundle_index=start,
                subgroup_world_size=size,
                process_on_nodes=resource_pool.store,
                use_gpu=resource_pool.use_gpu,
                name_prefix=f"{resource_pool.name_prefix}_split_{i}",
                max_colocate_count=resource_pool.max_colocate_count,
                detached=resource_pool.detached,
                accelerator_type=resource_pool.accelerator_type,
            )
        )
        start += size
    return views


def merge_resource_pool(rp1: RayResourcePool, rp2: RayResourcePool) -> RayResourcePool:
    """One pool whose ranks are ``rp1``'s then ``rp2``'s (placement groups created now and shared; the merged pool
    does not own them). Both must agree on ``use_gpu``, ``max_colocate_count``, ``n_gpus_per_node`` and
    ``detached``."""
    for attr in ("use_gpu", "max_colocate_count", "n_gpus_per_node", "detached"):
        if getattr(rp1, attr) != getattr(rp2, attr):
            raise ValueError(
                f"merge_resource_pool: the pools differ in {attr} ({getattr(rp1, attr)!r} vs {getattr(rp2, attr)!r})"
            )
    slots = rp1.bundle_slots() + rp2.bundle_slots()
    pgs: list[PlacementGroup] = []
    counts: dict[Any, int] = {}
    for pg, _ in slots:
        if pg.id not in counts:
            pgs.append(pg)
            counts[pg.id] = 0
        counts[pg.id] += 1
    merged = RayResourcePool(
        [counts[pg.id] for pg in pgs],
        use_gpu=rp1.use_gpu,
        name_prefix=f"{rp1.name_prefix}_{rp2.name_prefix}",
        max_colocate_count=rp1.max_colocate_count,
        detached=rp1.detached,
        accelerator_type=rp1.accelerator_type,
    )
    merged.n_gpus_per_node = rp1.n_gpus_per_node
    merged.pgs, merged._slots, merged._owns_pgs = pgs, slots, False
    return merged


class RayClassWithInitArgs(ClassWithInitArgs):
    """A Ray actor class and its constructor arguments; calling it starts one actor with the given options."""

    def __init__(self, cls: Any, *args, **kwargs) -> None:
        if not hasattr(cls, "__ray_actor_class__"):
            cls = remote_worker_class(cls)
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


# a task in a module that imports nothing heavy: the worker that runs it starts in well under a second
_rendezvous_address = ray.remote(num_cpus=0)(node_ip_and_free_port)


def _node_id(actor: Any) -> str:
    return ray.get_runtime_context().get_node_id()


def _rendezvous_on(pg: PlacementGroup, bundle_index: int = 0) -> tuple[str, int]:
    """The IP of the node holding bundle ``bundle_index`` of ``pg`` and a free port there (for rank 0's process
    group)."""
    node_id = ray.util.placement_group_table(pg)["bundles_to_node_id"][bundle_index]
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
        worker_env: extra environment variables for every actor started; one that the group sets itself
            (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``, ...) is refused with a ``ValueError`` naming it.
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
        worker_env: dict[str, str] | None = None,
        **kwargs,
    ) -> None:
        name_prefix = name_prefix or f"wg_{uuid.uuid4().hex[:6]}"
        self._worker_env = {str(k): str(v) for k, v in (worker_env or {}).items()}
        if self._worker_env and (worker_handles is not None or worker_names is not None):
            raise ValueError("worker_env applies to actors the group starts; it cannot be given with worker_handles")
        clash = sorted(set(self._worker_env) & set(GROUP_ENV_VARS))
        if clash:
            raise ValueError(
                f"worker_env of worker group {name_prefix!r} sets {clash}, which the group sets itself for each "
                "rank; remove them from worker_env"
            )
        super().__init__(resource_pool=resource_pool, name_prefix=name_prefix)
        if ray_cls_with_init is None:
            raise ValueError("RayWorkerGroup needs ray_cls_with_init (the worker class and its arguments)")
        self.ray_cls_with_init = ray_cls_with_init
        self._detached = detached
        self.resource_pool = resource_pool
        self._worker_nodes: list[str] = []  # the node id of each rank's actor (empty: not known)
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
        """One actor per bundle slot of the pool (all of a `RayResourcePool`, a range of a split one)."""
        slots = resource_pool.bundle_slots()
        use_gpu = resource_pool.uses_gpu()
        share = 1.0 / resource_pool.max_colocate_count
        master_addr, master_port = _rendezvous_on(*slots[0])
        nodes = {pg.id: ray.util.placement_group_table(pg)["bundles_to_node_id"] for pg, _ in slots}
        pg_index: dict[Any, int] = {}
        for rank, ((pg, bundle_idx), (local_world_size, local_rank)) in enumerate(zip(slots, _local_layout(slots))):
            pg_idx = pg_index.setdefault(pg.id, len(pg_index))
            env_vars = {
                "WORLD_SIZE": str(len(slots)),
                "RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(local_world_size),
                "RAY_LOCAL_WORLD_SIZE": str(local_world_size),
                "LOCAL_RANK": str(local_rank),
                "MASTER_ADDR": str(master_addr),
                "MASTER_PORT": str(master_port),
                "WG_PREFIX": self.name_prefix,
                "WG_BACKEND": "ray",
            }
            assert set(env_vars) == set(GROUP_ENV_VARS), "GROUP_ENV_VARS must list the variables set here"
            env_vars.update(self._worker_env)
            name = f"{self.name_prefix}{cls_with_init.user_cls.__name__}_{pg_idx}:{local_rank}"
            actor = cls_with_init(
                pg,
                bundle_idx,
                use_gpu=use_gpu,
                num_gpus=share,
                num_cpus=share,
                env_vars=env_vars,
                name=name,
                detached=self._detached,
            )
            self._workers.append(actor)
            self._worker_names.append(name)
            self._worker_nodes.append(nodes[pg.id][bundle_idx])

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
            group.method_prefix = start  # the role's methods on the fused actors (e.g. its server methods)
            group._worker_nodes = list(self._worker_nodes)
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

    @property
    def worker_nodes(self) -> list[str]:
        """The Ray node id of each rank's actor (recorded at start; asked of the actors for a wrapped group)."""
        if len(self._worker_nodes) != len(self._workers):
            self._worker_nodes = ray.get([w.__ray_call__.remote(_node_id) for w in self._workers])
        return list(self._worker_nodes)

    def _where(self, rank: int) -> str:
        if rank >= len(self._worker_nodes):
            return ""
        from verl.single_controller.ray.health import describe_node

        return f", on {describe_node(self._worker_nodes[rank])}"

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
                        f"worker group {self.name_prefix!r}: rank {rank} ({self._worker_names[rank]}"
                        f"{self._where(rank)}) died while running {method_name!r}: {e}"
                    ) from e
                except RayTaskError as e:
                    self._raise_if_a_peer_died(pending, position, ranks, method_name, e)
                    if hasattr(e, "add_note"):
                        e.add_note(f"(worker group {self.name_prefix!r}, rank {rank}, method {method_name!r})")
                    raise
        return results[0] if single else results

    def _raise_if_a_peer_died(
        self, pending: list[Any], position: dict[Any, int], ranks: list[int], method_name: str, error: BaseException
    ) -> None:
        """A rank's error in a collective (gloo: "connection reset by peer") is often the echo of another rank's
        death: give the other ranks' calls ``PEER_DEATH_WAIT_S`` to end, and name a rank that died as the cause."""
        seen = getattr(error, "cause", None) or error  # a RayTaskError's own text starts with Ray's task header
        seen_text = f"{type(seen).__name__}: {(str(seen).splitlines() or [''])[0]}"
        ended, _ = ray.wait(pending, num_returns=len(pending), timeout=PEER_DEATH_WAIT_S) if pending else ([], [])
        for ref in ended:
            rank = ranks[position[ref]]
            try:
                ray.get(ref)
            except RayActorError as death:
                raise WorkerDiedError(
                    f"worker group {self.name_prefix!r}: rank {rank} ({self._worker_names[rank]}{self._where(rank)}) "
                    f"died while running {method_name!r} (another rank saw {seen_text}): {death}"
                ) from error
            except Exception:  # noqa: BLE001 — another rank's own error; the first one seen is raised
                continue


# fused workers and server methods (their own module; imported here for veRL's import paths)
from verl.single_controller.ray.colocated import (  # noqa: E402
    FusedWorkerCLSName,
    create_colocated_worker_cls,
    create_colocated_worker_raw_cls,
    remote_worker_class,
)
