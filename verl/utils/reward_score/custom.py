"""User reward functions loaded from a file (``custom_reward_function.{path, name, reward_kwargs}``).

:class:`FileFunction` is picklable by reference (path, name, kwargs): a scoring worker process loads the file
itself on first use, so functions defined in a user's script work in a process pool.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from verl.utils.py_functional import accepted_kwargs

__all__ = ["FileFunction", "load_function_from_file", "load_object_from_file"]


def load_object_from_file(
    path: str | os.PathLike,
    name: str,
    path_key: str = "reward.custom_reward_function.path",
    name_key: str = "reward.custom_reward_function.name",
) -> Any:
    """Import the file at ``path`` (once per process) and return its attribute ``name``.

    Errors name the config keys (``path_key``, ``name_key``) the two values came from.
    """
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path_key}={path!r}: no such file")
    module_name = "verl_user_module_" + hashlib.sha1(path.encode()).hexdigest()[:12]
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"{path_key}={path!r}: not a Python file that can be imported")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # before exec: pickling by reference and dataclasses need it
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    if not hasattr(module, name):
        raise AttributeError(f"{name_key}={name!r}: {path} defines no such attribute")
    return getattr(module, name)


def load_function_from_file(path: str | os.PathLike, name: str) -> Callable[..., Any]:
    """``custom_reward_function.name`` from the file ``custom_reward_function.path``; it must be callable."""
    fn = load_object_from_file(path, name)
    if not callable(fn):
        raise TypeError(
            f"reward.custom_reward_function.name={name!r} in {path} is a {type(fn).__name__}, not a function"
        )
    return fn


class FileFunction:
    """``name`` from the file at ``path``, called with ``kwargs`` merged over the call's keywords (they win); the
    function gets only the keywords its signature declares (all of them with ``**kwargs``)."""

    def __init__(self, path: str | os.PathLike, name: str = "compute_score", kwargs: Mapping[str, Any] | None = None):
        self.path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        self.name = name
        self.kwargs = dict(kwargs or {})
        self._fn: Callable[..., Any] | None = None

    def load(self) -> Callable[..., Any]:
        """The underlying function (the file is imported on the first call in each process)."""
        if self._fn is None:
            self._fn = load_function_from_file(self.path, self.name)
        return self._fn

    @property
    def __wrapped__(self) -> Callable[..., Any]:  # inspect.signature follows it to the user's function
        return self.load()

    def describe(self) -> str:
        """``name (path)``, for error messages."""
        return f"{self.name} ({self.path})"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.load()
        return fn(*args, **accepted_kwargs(fn, {**kwargs, **self.kwargs}))

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "name": self.name, "kwargs": self.kwargs, "_fn": None}

    def __repr__(self) -> str:
        return f"FileFunction({self.path!r}, {self.name!r}, kwargs={self.kwargs!r})"
