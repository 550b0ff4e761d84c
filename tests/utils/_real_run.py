"""The trackers' real run: ``python -m verl.trainer.main_ppo`` (the built-in demo, 4 steps) with every tracker on.

It is the run ``demo_zero_adv_kept`` of ``tests/trainer/test_main_ppo.py`` (which adds `tracker_setup` to it: the
backends change nothing it logs, and its tests compare its metrics only); test_tracking.py and test_plot.py read
it through :func:`real_run`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("console", "file", "tensorboard", "wandb", "mlflow")
STEPS = 4  # the run's steps; it validates at the last
RUN = "demo_zero_adv_kept"
VAL_SAMPLES = 2


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


def tracker_setup(work: Path) -> tuple[list[str], dict[str, str | None]]:
    """The overrides and environment that send a run's metrics to every backend, validating at step `STEPS` with
    `VAL_SAMPLES` generations logged (into ``work``)."""
    environ: dict[str, str | None] = {
        k: None for k in os.environ if k.startswith(("WANDB_", "MLFLOW_", "TENSORBOARD_"))
    }
    environ.update(
        WANDB_MODE="offline",
        WANDB_DIR=str(work / "wandb"),
        MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow' / 'mlflow.db'}",
        TENSORBOARD_DIR=str(work / "tensorboard"),
    )
    overrides = [
        f"trainer.logger=[{','.join(BACKENDS)}]",
        f"trainer.test_freq={STEPS}",
        f"trainer.log_val_generations={VAL_SAMPLES}",
    ]
    return overrides, environ


def real_run(cli_runs: Mapping) -> RealRun:
    """The run `RUN` (a test reading it names it: ``@needs(RUN)``)."""
    run = cli_runs[RUN]
    return RealRun(
        root=run.work,
        returncode=run.returncode,
        output=run.output,
        jsonl=run.work / "run.jsonl",
        val_jsonl=run.work / "run.val_generations.jsonl",
        tensorboard_dir=run.work / "tensorboard",
        wandb_dir=run.work / "wandb",
        mlflow_uri=f"sqlite:///{run.work / 'mlflow' / 'mlflow.db'}",
    )
