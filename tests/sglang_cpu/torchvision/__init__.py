"""An import-only stand-in for ``torchvision`` (tests only; see tests/sglang_cpu/README.md).

SGLang's and transformers' vision code import torchvision modules and names at module level; a dense text model
never calls them. Every ``torchvision.*`` module imports here, and every name in it is a stand-in that raises when
called (naming itself), except ``transforms.InterpolationMode``, a real enum (module-level tables key on it).
"""

from __future__ import annotations

import enum
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+verl-cpu-stand-in"


class StandIn:
    """A torchvision name: attributes are more stand-ins; calling it raises."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> StandIn:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return StandIn(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{self._name} was called, but torchvision here is the CPU stand-in of tests/sglang_cpu (no vision ops)"
        )

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


class InterpolationMode(enum.Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


class _StandInModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return StandIn(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every ``torchvision.<sub>`` imports as a stand-in module (a package, so deeper imports work too)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        if spec.name == __name__ + ".transforms":
            module.InterpolationMode = InterpolationMode
        return module

    def exec_module(self, module):
        pass


if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _Finder())


def __getattr__(attr: str):
    if attr.startswith("__"):
        raise AttributeError(attr)
    return (
        importlib.import_module(f"{__name__}.{attr}")
        if attr in ("transforms", "io", "ops")
        else StandIn(f"{__name__}.{attr}")
    )
