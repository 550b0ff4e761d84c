"""Schema of ``*.optim`` (``actor_rollout_ref.actor.optim``, ``critic.optim``): veRL's field names and defaults.

The optimizer is built by name (``optimizer_impl`` + ``optimizer``, AdamW from ``torch.optim`` by default) and driven
by a learning-rate schedule (see :mod:`verl.workers.engine.lr_schedule`): linear warmup to ``lr`` over
``lr_warmup_steps`` (or ``lr_warmup_steps_ratio · total_training_steps``), then either constant or cosine decay to
``min_lr_ratio · lr``. The trainer knows ``total_training_steps`` only once the data is loaded: it builds a copy with
``dataclasses.replace(optim, total_training_steps=n)`` (configs are frozen; nobody assigns to a user's key).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

from verl.base_config import BaseConfig

__all__ = ["LR_SCHEDULER_TYPES", "FSDPOptimizerConfig", "OptimConfig", "OptimizerConfig", "role_optim_default"]

# Shapes of the learning-rate schedule after warmup (the registry in verl.workers.engine.lr_schedule has the same keys).
LR_SCHEDULER_TYPES = ("constant", "cosine")


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class OptimizerConfig(BaseConfig):
    """Fields every optimizer config shares (veRL's ``OptimizerConfig``).

    Args:
        lr: peak learning rate (reached after warmup).
        lr_warmup_steps_ratio: warmup length as a fraction of ``total_training_steps``; used when ``lr_warmup_steps``
            is -1 or null.
        total_training_steps: optimizer steps of the whole run; -1 while unknown (the trainer sets it). A cosine
            schedule or a warmup ratio > 0 needs it.
        weight_decay: decoupled weight decay (AdamW), applied to every parameter.
        lr_warmup_steps: warmup length in optimizer steps; -1 or null: use ``lr_warmup_steps_ratio``.
        betas: Adam's (β1, β2).
        clip_grad: the total gradient norm is clipped to this value before each step by
            ``FSDPEngine.clip_grad_norm_and_step`` when it is given no norm (the PPO actor and critic updates pass
            their own ``grad_clip``).
        grad_clip: deprecated alias of ``clip_grad`` (a DeprecationWarning; when set, it is the value used).
    """

    lr: float = 1e-6
    lr_warmup_steps_ratio: float = 0.0
    total_training_steps: int = -1
    weight_decay: float = 0.01
    lr_warmup_steps: int | None = -1
    betas: tuple[float, float] = (0.9, 0.999)
    clip_grad: float = 1.0
    grad_clip: float | None = None

    def _problems(self, prefix: str) -> list[str]:
        """Every invalid field, one message each (key, value, what is allowed)."""
        problems = []
        if not _is_number(self.lr) or not math.isfinite(self.lr) or self.lr < 0:
            problems.append(f"{prefix}.lr={self.lr!r} must be a finite number >= 0")
        ratio = self.lr_warmup_steps_ratio
        if not _is_number(ratio) or not 0.0 <= ratio <= 1.0:
            problems.append(f"{prefix}.lr_warmup_steps_ratio={ratio!r} must be a fraction in [0, 1]")
        steps = self.total_training_steps
        if not _is_int(steps) or (steps != -1 and steps < 1):
            problems.append(f"{prefix}.total_training_steps={steps!r} must be -1 (not known yet) or an integer >= 1")
        if not _is_number(self.weight_decay) or self.weight_decay < 0:
            problems.append(f"{prefix}.weight_decay={self.weight_decay!r} must be a number >= 0")
        warm = self.lr_warmup_steps
        if warm is not None and (not _is_int(warm) or warm < -1):
            problems.append(f"{prefix}.lr_warmup_steps={warm!r} must be -1/null (use the ratio) or an integer >= 0")
        betas = self.betas
        if (
            not isinstance(betas, list | tuple)
            or len(betas) != 2
            or not all(_is_number(b) and 0.0 <= b < 1.0 for b in betas)
        ):
            problems.append(f"{prefix}.betas={betas!r} must be two numbers in [0, 1), e.g. [0.9, 0.999]")
        for name in ("clip_grad", "grad_clip"):
            value = getattr(self, name)
            if value is None and name == "grad_clip":
                continue
            if not _is_number(value) or not value > 0:
                problems.append(f"{prefix}.{name}={value!r} must be a number > 0")
        return problems

    def _fold_alias(self, alias: str, canonical: str, default: Any) -> None:
        """Resolve a deprecated alias into its canonical field, once, while the config is being built.

        The alias wins over the canonical field's default; both set to different values is an error.
        """
        value = getattr(self, alias)
        if value is None:
            return
        warnings.warn(f"optim.{alias} is deprecated, use optim.{canonical}", DeprecationWarning, stacklevel=4)
        current = getattr(self, canonical)
        if current != default and current != value:
            raise ValueError(
                f"optim.{alias}={value!r} (deprecated) conflicts with optim.{canonical}={current!r}; set only "
                f"optim.{canonical}"
            )
        # Construction is not finished yet: this is the field's one resolution, not a later mutation.
        object.__setattr__(self, canonical, value)

    def __post_init__(self) -> None:
        problems = self._problems("optim")
        if problems:
            raise ValueError("invalid optimizer config: " + "; ".join(problems))
        self._fold_alias("grad_clip", "clip_grad", 1.0)


@dataclass
class FSDPOptimizerConfig(OptimizerConfig):
    """``actor.optim`` / ``critic.optim`` for the FSDP engine (veRL's ``FSDPOptimizerConfig``).

    Args:
        optimizer: class name inside ``optimizer_impl`` (``AdamW``).
        optimizer_impl: module the optimizer class is imported from (``torch.optim``).
        min_lr_ratio: the cosine schedule decays to ``min_lr_ratio · lr``; null means 0.
        warmup_style: deprecated alias of ``lr_scheduler_type``.
        lr_scheduler_type: schedule after warmup: "constant" or "cosine".
        num_cycles: cosine periods over the decay phase; 0.5 is a half period, from ``lr`` down to the minimum.
        override_optimizer_config: extra keyword arguments for the optimizer class (e.g. ``{"eps": 1e-6}``).
    """

    optimizer: str = "AdamW"
    optimizer_impl: str = "torch.optim"
    min_lr_ratio: float | None = None
    warmup_style: str | None = None
    lr_scheduler_type: str = "constant"
    num_cycles: float = 0.5
    override_optimizer_config: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        problems = self._problems("optim")
        for name in ("optimizer", "optimizer_impl"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                problems.append(f"optim.{name}={getattr(self, name)!r} must be a non-empty string")
        ratio = self.min_lr_ratio
        if ratio is not None and (not _is_number(ratio) or not 0.0 <= ratio <= 1.0):
            problems.append(f"optim.min_lr_ratio={ratio!r} must be a fraction in [0, 1] or null")
        for name in ("warmup_style", "lr_scheduler_type"):
            value = getattr(self, name)
            if value is None and name == "warmup_style":
                continue
            if value not in LR_SCHEDULER_TYPES:
                problems.append(f"optim.{name}={value!r}; use one of {list(LR_SCHEDULER_TYPES)}")
        if not _is_number(self.num_cycles) or not self.num_cycles > 0:
            problems.append(f"optim.num_cycles={self.num_cycles!r} must be a number > 0")
        extra = self.override_optimizer_config
        if extra is not None and (not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra)):
            problems.append(f"optim.override_optimizer_config={extra!r} must be a mapping of keyword arguments or null")
        if problems:
            raise ValueError("invalid optimizer config: " + "; ".join(problems))
        self._fold_alias("grad_clip", "clip_grad", 1.0)
        self._fold_alias("warmup_style", "lr_scheduler_type", "constant")


def role_optim_default(**overrides: Any) -> FSDPOptimizerConfig:
    """A role's default ``optim``: the yaml's values, i.e. the dataclass defaults with ``min_lr_ratio=0.0`` (veRL's
    dataclass default is None, its yaml writes 0.0; both mean a cosine decay down to 0)."""
    return FSDPOptimizerConfig(**{"min_lr_ratio": 0.0, **overrides})


# Short name used in verl's docs and issues.
OptimConfig = FSDPOptimizerConfig


def __getattr__(name: str) -> Any:
    """``build_optimizer(parameters, config)``, veRL's name here; it is `verl.workers.engine.optim`'s (imported on
    first use: the configs do not import torch). ``McoreOptimizerConfig`` is `verl.workers.config.megatron`'s
    (imported on first use: that module imports this one)."""
    if name == "build_optimizer":
        from verl.workers.engine.optim import build_optimizer

        return build_optimizer
    if name == "McoreOptimizerConfig":  # veRL's home for it; defined beside the other Megatron configs
        from verl.workers.config.megatron import McoreOptimizerConfig

        return McoreOptimizerConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
