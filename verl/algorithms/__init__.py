"""The RL algorithms, below the workers and the trainer: pure tensor functions with no distributed state.

Advantage estimators (``advantages``, ``group_advantages``, ``otb``), policy losses (``policy_losses``,
``cov_losses``), loss aggregation (``agg``), KL penalties and controllers (``kl``), value and entropy losses
(``aux_losses``), PF-PPO resampling (``pf_ppo``), rollout correction (``rollout_corr_helper``), the name registries
(``registry``) and the ``algorithm.*`` config schemas (``config``); ``core_algos`` gathers the public names.

Importing this package loads nothing else: a submodule, or a public name of ``core_algos``
(``verl.algorithms.get_policy_loss_fn``), is imported on first access. veRL's paths (``verl.trainer.ppo.core_algos``,
``verl.trainer.config.algorithm``, ...) are these very modules.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

SUBMODULES = (
    "advantages",
    "agg",
    "aux_losses",
    "config",
    "core_algos",
    "cov_losses",
    "group_advantages",
    "kl",
    "otb",
    "pf_ppo",
    "policy_losses",
    "registry",
    "rollout_corr_helper",
)


def _core_algos() -> ModuleType:
    return importlib.import_module(f"{__name__}.core_algos")


def __getattr__(name: str) -> Any:
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if not name.startswith("_"):
        core = _core_algos()
        if name in core.__all__:
            return getattr(core, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *SUBMODULES, *_core_algos().__all__})
