"""Small helpers shared by the algorithm modules: config access that works for dataclasses, DictConfigs and dicts,
dtype choice, and input checks."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["cfg_get", "check_same_shape", "clip_bounds", "compute_dtype", "global_batch_kwargs", "sanitize"]


def cfg_get(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` for a BaseConfig dataclass, DictConfig, dict or plain object; ``default`` if absent/None."""
    if config is None:
        return default
    getter = getattr(config, "get", None)
    value = getter(key, default) if callable(getter) else getattr(config, key, default)
    return default if value is None else value


def clip_bounds(config: Any) -> tuple[float, float]:
    """(ε_low, ε_high): ``clip_ratio_low/high``, each falling back to ``clip_ratio`` (default 0.2)."""
    clip = cfg_get(config, "clip_ratio", 0.2)
    return float(cfg_get(config, "clip_ratio_low", clip)), float(cfg_get(config, "clip_ratio_high", clip))


def global_batch_kwargs(config: Any) -> dict[str, Any]:
    """Keyword arguments for ``agg_loss`` from ``config.global_batch_info`` (+ ``config.loss_scale_factor``)."""
    kwargs = dict(cfg_get(config, "global_batch_info", {}))
    if kwargs.get("loss_scale_factor") is None:
        kwargs.pop("loss_scale_factor", None)
        scale = cfg_get(config, "loss_scale_factor", None)
        if scale is not None:
            kwargs["loss_scale_factor"] = scale
    return kwargs


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """fp64 if any input is fp64, else fp32: algorithms upcast bf16/fp16 inputs and compute in at least fp32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def sanitize(x: torch.Tensor, valid: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """``x`` with ``fill`` where ``valid`` is False, so padding (even NaN/inf) reaches neither values nor gradients."""
    return torch.where(valid, x, torch.full((), fill, dtype=x.dtype, device=x.device))


def check_same_shape(**tensors: torch.Tensor | None) -> None:
    """Raise ``ValueError`` naming the arguments unless all given tensors share one 2-D shape."""
    given = {k: v for k, v in tensors.items() if v is not None}
    shapes = {k: tuple(v.shape) for k, v in given.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(s != first for s in shapes.values()):
        raise ValueError(f"expected tensors of one (batch, response_length) shape, got {shapes}")
