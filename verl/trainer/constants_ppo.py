"""veRL's ``verl.trainer.constants_ppo``: the environment the PPO job's Ray workers get.

``PPO_RAY_RUNTIME_ENV`` holds the defaults; `ppo_worker_env` adds verl's own ``VERL_*`` settings of this process
(they travel with the job); `get_ppo_ray_runtime_env` is what a recipe's main passes to ``ray.init``: the same,
less the defaults this process already sets (a local cluster inherits them).
"""

from __future__ import annotations

import os
from typing import Any

PPO_RAY_RUNTIME_ENV: dict[str, Any] = {
    "env_vars": {
        "TOKENIZERS_PARALLELISM": "false",  # the workers' tokenizers run beside other threads
        "RAY_AUTH_MODE": "disabled",
    },
}


def ppo_worker_env() -> dict[str, str]:
    """The workers' environment variables: the defaults, then every non-empty ``VERL_*`` variable of this process."""
    env = dict(PPO_RAY_RUNTIME_ENV["env_vars"])
    env.update({k: v for k, v in os.environ.items() if k.startswith("VERL_") and v})
    return env


def get_ppo_ray_runtime_env() -> dict[str, Any]:
    """A runtime env for ``ray.init``: `ppo_worker_env` without the defaults already set in this process."""
    defaults = PPO_RAY_RUNTIME_ENV["env_vars"]
    env = {k: v for k, v in ppo_worker_env().items() if k not in defaults or os.environ.get(k) is None}
    return {"env_vars": env}
