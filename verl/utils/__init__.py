"""Utilities shared across verl."""

__all__ = ["as_torch_index", "group_mean_std"]


def __getattr__(name: str):
    # veRL exposes these two at `verl.utils`; import torch only when they are asked for.
    if name in __all__:
        from verl.utils import torch_functional

        return getattr(torch_functional, name)
    raise AttributeError(f"module 'verl.utils' has no attribute {name!r}")
