"""The single controller: one driver calls groups of workers (Ray actors) as if they were local objects."""

from verl.single_controller.base import ClassWithInitArgs, ResourcePool, Worker, WorkerGroup

__all__ = ["ClassWithInitArgs", "ResourcePool", "Worker", "WorkerGroup"]
