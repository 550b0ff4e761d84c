"""The Ray backend: `RayResourcePool` (and its splits / merges), `RayClassWithInitArgs`, `RayWorkerGroup`, and
fusing roles into one actor class (`create_colocated_worker_cls`)."""

from verl.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    SubRayResourcePool,
    WorkerDiedError,
    create_colocated_worker_cls,
    create_colocated_worker_raw_cls,
    merge_resource_pool,
    remote_worker_class,
    split_resource_pool,
)

__all__ = [
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
