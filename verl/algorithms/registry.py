"""Name → function registries for advantage estimators and policy losses.

A recipe adds an algorithm by decorating a function, never by forking the trainer::

    @register_adv_est("my_estimator")
    def my_estimator(token_level_rewards, response_mask, index, config=None, **kwargs): ...

The built-in entries are registered when :mod:`verl.algorithms.core_algos` is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

import torch

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdvantageEstimator",
    "PolicyLossFn",
    "get_adv_estimator_fn",
    "get_policy_loss_fn",
    "register_adv_est",
    "register_policy_loss",
]


class AdvantageEstimator(str, Enum):
    """The built-in advantage estimators (``algorithm.adv_estimator``); any registered string works too."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


# (old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights) -> (loss, metrics)
PolicyLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str, Any, "torch.Tensor | None"],
    tuple[torch.Tensor, dict[str, Any]],
]

ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {}
POLICY_LOSS_REGISTRY: dict[str, PolicyLossFn] = {}


def _name(name_or_enum: str | Enum) -> str:
    name = name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum
    if not isinstance(name, str) or not name:
        raise ValueError(f"a registry name must be a non-empty string, got {name_or_enum!r}")
    return name


def _register(registry: dict[str, Callable], kind: str, name: str, fn: Callable) -> Callable:
    existing = registry.get(name)
    if existing is not None and existing is not fn:
        raise ValueError(
            f"{kind} {name!r} is already registered to {existing.__module__}.{existing.__qualname__}; "
            f"cannot register {fn.__module__}.{fn.__qualname__} under the same name"
        )
    registry[name] = fn
    return fn


def register_adv_est_in(
    registry: dict[str, Callable], name_or_enum: str | AdvantageEstimator
) -> Callable[[Callable], Callable]:
    """`register_adv_est` on an explicit ``registry`` dict (``verl.trainer.ppo.core_algos`` passes its own binding)."""
    name = _name(name_or_enum)
    return lambda fn: _register(registry, "advantage estimator", name, fn)


def lookup_adv_est(
    registry: dict[str, Callable], name_or_enum: str | AdvantageEstimator
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """`get_adv_estimator_fn` on an explicit ``registry`` dict. The error keeps veRL's wording
    ("Unknown advantage estimator simply: <name>") and adds the config key and the registered names."""
    name = name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum
    if name not in registry:
        raise ValueError(
            f"Unknown advantage estimator simply: {name} (algorithm.adv_estimator); registered: {sorted(registry)}"
        )
    return registry[name]


def register_adv_est(name_or_enum: str | AdvantageEstimator) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under ``name_or_enum``.

    Registering the same function twice is a no-op; a different function under a taken name raises ``ValueError``.
    """
    return register_adv_est_in(ADV_ESTIMATOR_REGISTRY, name_or_enum)


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """The advantage estimator registered under ``name_or_enum``; ``ValueError`` listing the valid names if none."""
    return lookup_adv_est(ADV_ESTIMATOR_REGISTRY, name_or_enum)


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register a policy loss under ``name`` (same duplicate rule as :func:`register_adv_est`)."""
    name = _name(name)
    return lambda fn: _register(POLICY_LOSS_REGISTRY, "policy loss", name, fn)


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The policy loss registered under ``name``; ``ValueError`` listing the valid names if none."""
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"unknown policy loss {name!r} (actor.policy_loss.loss_mode); registered: {sorted(POLICY_LOSS_REGISTRY)}"
        )
    return POLICY_LOSS_REGISTRY[name]
