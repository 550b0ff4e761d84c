"""One real ``python -m verl.trainer.main_ppo`` run (the built-in demo, 3 steps) with every tracker enabled.

Shared by test_tracking.py and test_plot.py: :func:`real_run` starts the trainer on first use and caches the
result for the rest of the pytest process, so a session runs the trainer once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

BACKENDS = ("console", "file", "tensorboard", "wandb", "mlflow")
STEPS = 3
VAL_SAMPLES = 2
TIMEOUT_S = 400


@dataclass(frozen=True)
class RealRun:
    """Where the run wrote, and what it printed."""

    root: Path
    returncode: int
    output: str
    jsonl: Path
    val_jsonl: Path
    tensorboard_dir: Path
    wandb_dir: Path
    mlflow_uri: str


_CACHE: dict[str, RealRun] = {}


def real_run(tmp_path_factory: pytest.TempPathFactory) -> RealRun:
    """Run the trainer once per process (validation at the last step, 2 logged val generations) and return it."""
    if "run" in _CACHE:
        return _CACHE["run"]
    root = tmp_path_factory.mktemp("real_run")
    jsonl = root / "run.jsonl"
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TENSORBOARD_"))}
    environ.update(
        VERL_FILE_LOGGER_PATH=str(jsonl),
        # the same cache as tests/trainer/test_main_ppo.py, so a session builds the demo assets once
        VERL_CACHE_DIR=str(tmp_path_factory.getbasetemp() / "verl_cache"),
        WANDB_MODE="offline",
        WANDB_DIR=str(root / "wandb"),
        MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow' / 'mlflow.db'}",
        TENSORBOARD_DIR=str(root / "tensorboard"),
        RAY_AUTH_MODE="disabled",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        HYDRA_FULL_ERROR="1",
    )
    args = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.logger=[{','.join(BACKENDS)}]",
        f"trainer.test_freq={STEPS}",
        f"trainer.log_val_generations={VAL_SAMPLES}",
        f"hydra.run.dir={root / 'hydra'}",
        f"trainer.default_local_dir={root / 'ckpt'}",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT_S, env=environ, cwd=root)
    _CACHE["run"] = RealRun(
        root=root,
        returncode=proc.returncode,
        output=proc.stdout + proc.stderr,
        jsonl=jsonl,
        val_jsonl=root / "run.val_generations.jsonl",
        tensorboard_dir=root / "tensorboard",
        wandb_dir=root / "wandb",
        mlflow_uri=environ["MLFLOW_TRACKING_URI"],
    )
    return _CACHE["run"]
