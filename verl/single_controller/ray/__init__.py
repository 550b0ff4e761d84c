"""The Ray backend: `RayResourcePool`, `RayClassWithInitArgs`, `RayWorkerGroup`, `create_colocated_worker_cls`."""

from verl.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    WorkerDiedError,
    create_colocated_worker_cls,
)

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "WorkerDiedError",
    "create_colocated_worker_cls",
]
