"""``python -m recipe.dapo.main_dapo [key=value ...]``: DAPO (Yu et al., 2025, arXiv:2503.14476), veRL's recipe layout.

The config is ``config/dapo_trainer.yaml``: the base trainer config (``verl/trainer/config/ppo_trainer.yaml``) with
DAPO's settings on top, so every base key can be overridden on the command line. ``main`` → ``run_ppo`` (validates
the config, starts Ray) → :class:`DAPOTaskRunner` (a Ray actor) → :class:`RayDAPOTrainer` ``init_workers()`` /
``fit()`` — the trainer's own loop, with its built-in dynamic sampling. Run from the repository root (``recipe`` is a
folder of the checkout, not an installed package).
"""

from __future__ import annotations

import os

import hydra
import ray
from omegaconf import DictConfig

from recipe.dapo.dapo_ray_trainer import RayDAPOTrainer
from verl.trainer.main_ppo import TaskRunner, run_ppo

__all__ = ["DAPOTaskRunner", "main"]


class DAPOTaskRunner(TaskRunner):
    """The PPO task runner with :class:`~recipe.dapo.dapo_ray_trainer.RayDAPOTrainer` as its trainer: the same
    workers (``add_*_worker``), resource pools, tokenizer, reward managers and data."""

    trainer_class = RayDAPOTrainer


@hydra.main(config_path="config", config_name="dapo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """The command-line entry point."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    run_ppo(config, task_runner_class=ray.remote(num_cpus=1)(DAPOTaskRunner))


if __name__ == "__main__":
    main()
