"""``LoraSpec``: the LoRA setup of a model section (veRL's ``lora_rank``, ``lora_alpha``, ``target_modules``,
``exclude_modules``, ``lora_adapter_path``), validated; the engine applies it (``verl.workers.engine.lora``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["LoraSpec"]


@dataclass(frozen=True)
class LoraSpec:
    """What LoRA to put on a model (veRL's ``model.lora_rank``, ``lora_alpha``, ``target_modules``,
    ``exclude_modules``, ``lora_adapter_path``)."""

    rank: int
    alpha: float = 16
    target_modules: Any = "all-linear"
    exclude_modules: Any = None
    adapter_path: str | None = None

    @property
    def scaling(self) -> float:
        """``alpha / rank``: the factor of ``B @ A`` in the adapted weight."""
        return float(self.alpha) / self.rank

    @classmethod
    def from_config(cls, model: Any, key: str = "actor_rollout_ref.model") -> LoraSpec | None:
        """The spec of a model config (``HFModelConfig``, ``critic.model``, the SFT ``model`` section, or a mapping);
        None when ``lora_rank`` is 0. ``key`` names the section in errors."""

        def get(name: str, default: Any = None) -> Any:
            return model.get(name, default) if isinstance(model, Mapping) else getattr(model, name, default)

        for name in ("target_modules", "exclude_modules"):  # checked even without LoRA: a wrong type is a typo
            value = get(name)
            if not (value is None or isinstance(value, str) or all(isinstance(v, str) for v in value)):
                raise TypeError(f"{key}.{name}={value!r} must be a module name pattern or a list of module names")
        rank = get("lora_rank", 0) or 0
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"{key}.lora_rank={rank!r} must be an integer >= 0")
        if rank == 0:
            return None
        alpha = get("lora_alpha", 16)
        if not isinstance(alpha, (int, float)) or alpha <= 0:
            raise ValueError(f"{key}.lora_alpha={alpha!r} must be a positive number")
        targets = _plain(get("target_modules", "all-linear"))
        if not targets:
            raise ValueError(f"{key}.target_modules is empty: name the modules LoRA adapts, or 'all-linear'")
        return cls(rank, alpha, targets, _plain(get("exclude_modules")), get("lora_adapter_path") or None)


def _plain(value: Any) -> Any:
    """A list/tuple (or an omegaconf ListConfig) as a list of str; a str or None as is."""
    if value is None or isinstance(value, str):
        return value
    return [str(v) for v in value]
