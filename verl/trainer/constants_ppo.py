"""veRL's ``verl.trainer.constants_ppo``: the environment the PPO job's Ray workers get.

``PPO_RAY_RUNTIME_ENV`` holds the defaults; `ppo_worker_env` adds verl's own ``VERL_*`` settings of this process
(they travel with the job); `get_ppo_ray_runtime_env` is what a recipe's main passes to ``ray.init``: the same,
less the defaults this process already sets (a local cluster inherits them).

With ``global_profiler.tool=torch`` both also point ``NVTX_INJECTION64_PATH`` at a library that cannot load: some
CUDA images inject libcupti as the NVTX handler, which takes CUPTI's single subscriber slot and leaves the torch
profiler's traces without GPU kernels. ``VERL_KEEP_NVTX_INJECTION=1`` keeps the inherited value.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)

PPO_RAY_RUNTIME_ENV: dict[str, Any] = {
    "env_vars": {
        "TOKENIZERS_PARALLELISM": "false",  # the workers' tokenizers run beside other threads
        "RAY_AUTH_MODE": "disabled",
    },
}

NVTX_INJECTION_ENV = "NVTX_INJECTION64_PATH"
# Non-empty on purpose: a startup hook that fills the variable only when it is unset leaves this one alone.
NVTX_INJECTION_DISABLED = "/nonexistent/verl-nvtx-injection-disabled.so"


def _profiler_tool(config: Any) -> str | None:
    """``global_profiler.tool`` of a DictConfig / mapping, or None."""
    if config is None:
        return None
    profiler = config.get("global_profiler") if hasattr(config, "get") else getattr(config, "global_profiler", None)
    if profiler is None:
        return None
    return profiler.get("tool") if hasattr(profiler, "get") else getattr(profiler, "tool", None)


def _nvtx_override(config: Any) -> dict[str, str]:
    """``{NVTX_INJECTION_ENV: disabled}`` when the torch profiler runs and the user did not opt out, else ``{}``."""
    if _profiler_tool(config) != "torch" or os.environ.get("VERL_KEEP_NVTX_INJECTION", "0") == "1":
        return {}
    if os.environ.get(NVTX_INJECTION_ENV):
        logger.warning(
            "global_profiler.tool=torch: workers get %s=%s instead of %s so the profiler can record GPU kernels; "
            "set VERL_KEEP_NVTX_INJECTION=1 to keep it",
            NVTX_INJECTION_ENV,
            NVTX_INJECTION_DISABLED,
            os.environ[NVTX_INJECTION_ENV],
        )
    return {NVTX_INJECTION_ENV: NVTX_INJECTION_DISABLED}


def ppo_worker_env(config: Any = None) -> dict[str, str]:
    """The workers' environment variables: the defaults, every non-empty ``VERL_*`` variable of this process, and
    the NVTX override when ``config`` profiles with torch."""
    env = dict(PPO_RAY_RUNTIME_ENV["env_vars"])
    env.update({k: v for k, v in os.environ.items() if k.startswith("VERL_") and v})
    env.update(_nvtx_override(config))
    return env


def get_ppo_ray_runtime_env(config: Any = None) -> dict[str, Any]:
    """A runtime env for ``ray.init``: `ppo_worker_env` without the defaults already set in this process (the NVTX
    override is kept even when this process sets the variable: overriding it is its point)."""
    defaults = PPO_RAY_RUNTIME_ENV["env_vars"]
    env = {k: v for k, v in ppo_worker_env().items() if k not in defaults or os.environ.get(k) is None}
    env.update(_nvtx_override(config))
    return {"env_vars": env}
