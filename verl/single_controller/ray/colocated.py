"""Fused workers (several roles in one actor process) and the server methods of a worker class.

`create_colocated_worker_cls` fuses roles into one actor class whose registered methods are ``<role>_<method>``;
`remote_worker_class` makes the Ray actor class of a worker, with the concurrency group of its
:func:`~verl.single_controller.base.decorator.server_method` s. Both are importable from
``verl.single_controller.ray.base`` too (veRL's paths).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import ray

from verl.single_controller.base.decorator import (
    MAGIC_ATTR,
    SERVER_CONCURRENCY,
    SERVER_GROUP,
    server_method,
    server_methods,
)
from verl.single_controller.base.worker import Worker
from verl.single_controller.base.worker_group import ClassWithInitArgs

__all__ = [
    "FusedWorkerCLSName",
    "create_colocated_worker_cls",
    "create_colocated_worker_raw_cls",
    "remote_worker_class",
]


def remote_worker_class(cls: type) -> Any:
    """``ray.remote(cls)``; a class with :func:`server_method` s gets a subclass whose server methods run in the
    concurrency group :data:`SERVER_GROUP` (many requests at once on their own event loop, while the registered
    methods still run one at a time in the default group)."""
    names = server_methods(cls)
    if not names:
        return ray.remote(cls)
    namespace: dict[str, Any] = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
    for name in names:
        namespace[name] = _in_server_group(getattr(cls, name))
    served = type(cls.__name__, (cls,), namespace)
    return ray.remote(concurrency_groups={SERVER_GROUP: SERVER_CONCURRENCY})(served)


def _in_server_group(func: Any) -> Any:
    """``func`` (a server method) as a method of the concurrency group :data:`SERVER_GROUP`."""
    method = _forwarder(func, lambda self: functools.partial(func, self))
    method.__name__ = func.__name__
    method.__ray_concurrency_group__ = SERVER_GROUP
    return server_method(method)


def _forwarder(template: Any, target: Any) -> Any:
    """A method of ``template``'s kind (plain, coroutine or async generator) that calls ``target(self)``."""
    if inspect.isasyncgenfunction(template):

        async def method(self, *args, **kwargs):
            async for item in target(self)(*args, **kwargs):
                yield item

    elif inspect.iscoroutinefunction(template):

        async def method(self, *args, **kwargs):
            return await target(self)(*args, **kwargs)

    else:

        def method(self, *args, **kwargs):
            return target(self)(*args, **kwargs)

    return method


def _role_method(role: str, name: str, func: Any) -> Any:
    """A method of the fused class forwarding to ``self.worker_dict[role].<name>``; keeps @register's settings."""
    method = _forwarder(func, lambda self: getattr(self.worker_dict[role], name))
    method.__name__ = f"{role}_{name}"
    if hasattr(func, MAGIC_ATTR):
        setattr(method, MAGIC_ATTR, getattr(func, MAGIC_ATTR))
    else:
        server_method(method)
    return method


FusedWorkerCLSName = "FusedWorker"


def _plain_class(cls: Any) -> type:
    """The Python class behind a ``ray.remote`` actor class (or ``cls`` itself)."""
    return getattr(cls, "__ray_actor_class__", cls)


def create_colocated_worker_raw_cls(class_dict: dict[str, ClassWithInitArgs]) -> type:
    """The plain (not ``ray.remote``) `Worker` class that hosts several roles in one process.

    An instance builds each role's worker in-process: ``self.worker_dict[role]`` (also ``fused_worker_dict``, and
    the attribute ``self.<role>`` where that name is free); every role sees the others through its own
    ``fused_worker_dict``. Each ``@register``-ed method of a role is exposed as ``<role>_<method>``, and
    ``_fuw_execute("<role>_fwmn_<method>", ...)`` calls any method of a role (veRL's fused-worker convention).
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_raw_cls needs at least one role")
    roles = {role: (_plain_class(cia.cls), cia.args, cia.kwargs) for role, cia in class_dict.items()}

    def __init__(self, *args, **kwargs):
        Worker.__init__(self, *args, **kwargs)
        self.worker_dict = {role: cls(*a, **kw) for role, (cls, a, kw) in roles.items()}
        self.fused_worker_dict = self.worker_dict
        for role, worker in self.worker_dict.items():
            worker.fused_worker_dict = self.worker_dict
            if not hasattr(type(self), role):
                setattr(self, role, worker)

    def _fuw_execute(self, method_name: str, *args, **kwargs):
        role, sep, name = method_name.partition("_fwmn_")
        if not sep or role not in self.worker_dict:
            raise ValueError(
                f"_fuw_execute: {method_name!r} must be '<role>_fwmn_<method>', role one of {sorted(self.worker_dict)}"
            )
        return getattr(self.worker_dict[role], name)(*args, **kwargs)

    namespace: dict[str, Any] = {"__init__": __init__, "_fuw_execute": _fuw_execute, "__module__": __name__}
    for role, (cls, _, _) in roles.items():
        served = set(server_methods(cls))
        for name in dir(cls):
            func = getattr(cls, name, None)
            if isinstance(getattr(func, MAGIC_ATTR, None), dict) or name in served:
                namespace[f"{role}_{name}"] = _role_method(role, name, func)
    fused = type("WorkerDict_" + "_".join(roles), (Worker,), namespace)
    fused.is_fused_worker = True
    fused.raw_cls_dict = {role: cls for role, (cls, _, _) in roles.items()}
    return fused


def create_colocated_worker_cls(class_dict: dict[str, ClassWithInitArgs]) -> Any:
    """Fuse several roles into one actor class (they then share one process and its memory).

    The fused actor (:func:`create_colocated_worker_raw_cls`) builds every role's worker in-process and exposes
    each registered method as ``<role>_<method>``; ``RayWorkerGroup.spawn`` gives one group per role with the plain
    method names.
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    from verl.single_controller.ray.base import RayClassWithInitArgs

    return RayClassWithInitArgs(remote_worker_class(create_colocated_worker_raw_cls(class_dict)))
