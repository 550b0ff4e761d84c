"""Optional-package checks and loading user code by path, at veRL's import path (``verl.utils.import_utils``).

``load_extern_object("/path/to/my_dataset.py", "MyDataset")`` imports a user file once per process (through
:func:`verl.utils.reward_score.custom.load_object_from_file`); ``load_extern_object("pkg://my_pkg.data", "X")``
imports an installed module instead.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import types
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = [
    "FILE_PATH_PREFIX",
    "PKG_PATH_PREFIX",
    "deprecated",
    "import_external_libs",
    "is_megatron_core_available",
    "is_nvtx_available",
    "is_package_available",
    "is_sglang_available",
    "is_torch_npu_available",
    "is_trl_available",
    "is_vllm_available",
    "load_extern_object",
    "load_extern_type",
    "load_module",
]

PKG_PATH_PREFIX = "pkg://"
FILE_PATH_PREFIX = "file://"

F = TypeVar("F", bound=Callable[..., Any])


def is_package_available(name: str) -> bool:
    """Whether the (possibly dotted) module ``name`` can be imported, without importing it (not cached: ``sys.path``
    may change; the ``is_*_available`` checks below are cached, as in veRL)."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a missing parent package, or a module without __spec__
        return False


@functools.cache
def is_megatron_core_available() -> bool:
    """Whether ``megatron.core`` is installed."""
    return is_package_available("megatron.core")


@functools.cache
def is_vllm_available() -> bool:
    """Whether ``vllm`` is installed."""
    return is_package_available("vllm")


@functools.cache
def is_sglang_available() -> bool:
    """Whether ``sglang`` is installed."""
    return is_package_available("sglang")


@functools.cache
def is_nvtx_available() -> bool:
    """Whether ``nvtx`` is installed."""
    return is_package_available("nvtx")


@functools.cache
def is_trl_available() -> bool:
    """Whether ``trl`` is installed."""
    return is_package_available("trl")


@functools.cache
def is_torch_npu_available() -> bool:
    """Whether ``torch_npu`` (Ascend) is installed."""
    return is_package_available("torch_npu")


def import_external_libs(external_libs: str | Iterable[str] | None = None) -> list[types.ModuleType]:
    """Import each module of ``external_libs`` (one name or a list; e.g. a package that registers models with
    ``transformers``) and return the modules. A module that cannot be imported raises ``ImportError`` naming it."""
    if external_libs is None:
        return []
    names = [external_libs] if isinstance(external_libs, str) else list(external_libs)
    modules = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise TypeError(f"external_libs entries must be module names, got {name!r}")
        try:
            modules.append(importlib.import_module(name))
        except ImportError as e:
            raise ImportError(f"external_libs: cannot import module {name!r}: {e}") from e
    return modules


def load_module(module_path: str, module_name: str | None = None) -> types.ModuleType | None:
    """Import the module at ``module_path``: ``pkg://a.b`` (or ``pkg://a/b``) imports the installed module
    ``a.b``; a file path (optionally ``file://``-prefixed) imports that file once per process.

    ``module_name`` (file paths only) also registers the module in ``sys.modules`` under that name; a name already
    taken by another module raises ``RuntimeError``. An empty ``module_path`` returns None.
    """
    if not module_path:
        return None
    if module_path.startswith(PKG_PATH_PREFIX):
        return importlib.import_module(module_path[len(PKG_PATH_PREFIX) :].replace("/", "."))
    if module_path.startswith(FILE_PATH_PREFIX):
        module_path = module_path[len(FILE_PATH_PREFIX) :]
    return _load_file_module(module_path, module_name)


def _load_file_module(path: str, module_name: str | None) -> types.ModuleType:
    import sys

    from verl.utils.reward_score.custom import load_object_from_file

    # load_object_from_file imports the file once per process; any module attribute gets us the module itself.
    try:
        module = sys.modules[load_object_from_file(path, "__name__", path_key="module_path", name_key="__name__")]
    except FileNotFoundError:
        raise
    except Exception as e:  # the file itself failed to import (syntax error, its own imports, ...): veRL's type
        raise RuntimeError(f"module_path={path!r}: importing the file failed: {type(e).__name__}: {e}") from e
    if module_name is not None:
        existing = sys.modules.get(module_name)
        if existing is not None and existing is not module:
            raise RuntimeError(f"module_name={module_name!r} is already in sys.modules as a different module")
        sys.modules[module_name] = module
    return module


def load_extern_object(module_path: str, object_name: str) -> Any:
    """``getattr(load_module(module_path), object_name)``.

    ``module_path`` is a file path (``/x/my_mod.py``, ``file://x/my_mod.py``) or ``pkg://dotted.module``. As in
    veRL: an empty/None ``module_path`` or a missing object raises ``AttributeError`` (naming both), a file that
    fails to import raises ``RuntimeError``, a missing file ``FileNotFoundError``.
    """
    if not module_path:
        raise AttributeError(f"object_name={object_name!r}: module_path is empty, no module to read it from")
    module = load_module(module_path)
    if not hasattr(module, object_name):
        raise AttributeError(f"object_name={object_name!r}: module {module_path!r} defines no such attribute")
    return getattr(module, object_name)


def load_extern_type(file_path: str, type_name: str) -> type:
    """The class ``type_name`` defined in the file (or ``pkg://`` module) ``file_path``; ``TypeError`` when it is
    not a class. veRL's older name for :func:`load_extern_object`."""
    obj = load_extern_object(file_path, type_name)
    if not isinstance(obj, type):
        raise TypeError(f"type_name={type_name!r} in {file_path} is a {type(obj).__name__}, not a class")
    return obj


def deprecated(replacement: str = "") -> Callable[[F], F]:
    """Decorator: calling the function (or constructing the class) emits a ``FutureWarning`` naming
    ``replacement``."""

    def decorator(obj: F) -> F:
        name = f"{obj.__module__}.{obj.__qualname__}"
        message = f"{name} is deprecated" + (f"; use {replacement} instead" if replacement else "")
        if isinstance(obj, type):
            original_init = obj.__init__

            @functools.wraps(original_init)
            def init(self, *args, **kwargs):
                warnings.warn(message, FutureWarning, stacklevel=2)
                original_init(self, *args, **kwargs)

            obj.__init__ = init
            return obj

        @functools.wraps(obj)
        def wrapper(*args, **kwargs):
            warnings.warn(message, FutureWarning, stacklevel=2)
            return obj(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorator
