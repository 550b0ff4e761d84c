"""Import ``tensordict`` without importing ``torch._dynamo`` (~0.9 s of CPU in every process that imports it).

At import, tensordict marks a few functions for ``torch.compile`` with ``torch.compiler.allow_in_graph`` and
``torch.compiler.assume_constant_result``; each of those imports ``torch._dynamo`` only to set a mark and returns
the function itself. Here the marks are recorded while tensordict imports and set on the same functions, by the
same calls, right after ``torch._dynamo`` is imported (by a ``torch.compile``, a user, or anything else), so
compiled code sees exactly what it would have seen. Modules of verl take tensordict's names from here:

    from verl.utils.tensordict_import import TensorDict
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

# torch.compiler's decorators that import torch._dynamo only to mark their argument, which they return unchanged
DEFERRABLE = ("allow_in_graph", "assume_constant_result")
DYNAMO = "torch._dynamo"

_deferred: list[tuple[str, Any]] = []


def deferred_marks() -> list[tuple[str, Any]]:
    """The ``(decorator name, function)`` marks waiting for ``torch._dynamo`` (empty once it is imported)."""
    return list(_deferred)


def _apply_deferred() -> None:
    import torch.compiler

    marks, _deferred[:] = list(_deferred), []
    for name, fn in marks:
        getattr(torch.compiler, name)(fn)


def _defer(name: str, fn: Any) -> None:
    _deferred.append((name, fn))
    if not any(isinstance(finder, _DynamoFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _DynamoFinder())


def _recorder(name: str, real: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def mark(fn: Any) -> Any:
        if DYNAMO in sys.modules:  # loaded: nothing to save
            return real(fn)
        if isinstance(fn, list | tuple):  # allow_in_graph's list form
            return [mark(item) for item in fn]
        if not callable(fn):
            return real(fn)  # the real decorator's own error
        _defer(name, fn)
        return fn

    mark.__wrapped__ = real  # type: ignore[attr-defined]
    return mark


class _DynamoLoader(importlib.abc.Loader):
    """Runs torch._dynamo's own loader, then sets the recorded marks."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        _apply_deferred()


class _DynamoFinder(importlib.abc.MetaPathFinder):
    """Finds torch._dynamo as the other finders do and wraps its loader; leaves ``sys.meta_path`` after that."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != DYNAMO:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _DynamoLoader(spec.loader)
        return spec


def _import_tensordict() -> None:
    if "tensordict" in sys.modules or DYNAMO in sys.modules:
        import tensordict  # noqa: F401

        return
    import torch.compiler

    real = {name: getattr(torch.compiler, name) for name in DEFERRABLE}
    for name, fn in real.items():
        setattr(torch.compiler, name, _recorder(name, fn))
    try:
        import tensordict  # noqa: F401
    finally:
        for name, fn in real.items():
            setattr(torch.compiler, name, fn)
    if DYNAMO in sys.modules:  # imported by tensordict after all (another version): set the marks now
        _apply_deferred()


_import_tensordict()

from tensordict import NonTensorData, NonTensorStack, TensorDict  # noqa: E402 - after the import above

__all__ = ["NonTensorData", "NonTensorStack", "TensorDict", "deferred_marks"]
