"""veRL's ``verl.utils.model`` helpers that recipes import."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["compute_position_id_with_mask", "get_model_size", "print_model_size", "update_model_config"]

logger = logging.getLogger(__name__)


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a (left- or right-padded) attention mask: 0 at the first real token, counting real tokens,
    and 0 on the left padding."""
    return torch.clip(torch.cumsum(mask, dim=-1) - 1, min=0)


def get_model_size(model: torch.nn.Module, scale: str = "auto") -> tuple[float, str]:
    """The parameter count of ``model`` in units of ``scale`` ("B", "M", "K", "" or "auto": the largest unit
    under which it is at least 1), and the unit."""
    n_params = sum(p.numel() for p in model.parameters())
    units = {"B": 1e9, "M": 1e6, "K": 1e3, "": 1.0}
    if scale == "auto":
        scale = next((unit for unit, size in units.items() if n_params >= size), "")
    if scale not in units:
        raise ValueError(f"scale={scale!r}; use one of {list(units)} or 'auto'")
    return n_params / units[scale], scale


def print_model_size(model: torch.nn.Module, name: str | None = None) -> None:
    """Log (INFO) how many parameters ``model`` has, e.g. "Qwen2ForCausalLM contains 1.54B parameters"."""
    n_params, scale = get_model_size(model)
    logger.info("%s contains %.2f%s parameters", name or type(model).__name__, n_params, scale)


def _merged(current: Mapping, override: Mapping) -> dict:
    """A copy of ``current`` with ``override`` applied, nested mappings merged key by key."""
    merged = dict(current)
    for key, val in override.items():
        old = merged.get(key)
        merged[key] = _merged(old, val) if isinstance(val, Mapping) and isinstance(old, Mapping) else val
    return merged


def update_model_config(module_config: Any, override_config_kwargs: Mapping[str, Any]) -> None:
    """Apply ``override_config_kwargs`` to a (Hugging Face) config object in place, e.g.
    ``{"attention_dropout": 0.0, "text_config": {"vocab_size": 8}}``.

    A mapping value recurses into the attribute it names when that attribute is a config object, is merged into it
    key by key when it is a dict (``rope_scaling``), and is set as a plain dict when the attribute is missing or
    None; any other value replaces (or adds) the attribute."""
    for key, val in override_config_kwargs.items():
        current = getattr(module_config, key, None)
        if isinstance(val, Mapping) and isinstance(current, Mapping):
            setattr(module_config, key, _merged(current, val))
        elif isinstance(val, Mapping) and current is not None and hasattr(current, "__dict__"):
            update_model_config(current, val)
        elif isinstance(val, Mapping):
            setattr(module_config, key, _merged({}, val))
        else:
            setattr(module_config, key, val)
