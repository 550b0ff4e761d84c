"""Print the trainer config a command line composes (veRL's ``scripts/print_cfg.py``).

    python scripts/print_cfg.py [key=value ...]

The same Hydra composition as ``python -m verl.trainer.main_ppo``, veRL's older names read into the newer ones
(each named in a warning), then printed as YAML without resolving interpolations. Nothing is validated or started.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verl.trainer.config.layout import resolve_layout  # noqa: E402


@hydra.main(config_path="../verl/trainer/config", config_name="ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    """Print ``config`` (after :func:`resolve_layout`)."""
    print(OmegaConf.to_yaml(resolve_layout(config)))


if __name__ == "__main__":
    main()
