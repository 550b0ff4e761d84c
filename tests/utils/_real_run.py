"""One real ``python -m verl.trainer.main_ppo`` run (the built-in demo, 3 steps) with every tracker enabled.

Shared by test_tracking.py and test_plot.py: the run ``trackers``, declared here and started by the session's
scheduler (`tests/cli_runs.py`); :func:`real_run` gives where it wrote.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tests.cli_runs import Prepared, cli_run

BACKENDS = ("console", "file", "tensorboard", "wandb", "mlflow")
STEPS = 3
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


@cli_run("trackers", cost_s=50)
def _trackers(work: Path) -> Prepared:
    """The demo for `STEPS` steps, validating at the last, logging to every backend."""
    environ = {k: None for k in os.environ if k.startswith(("WANDB_", "MLFLOW_", "TENSORBOARD_"))}
    environ.update(
        WANDB_MODE="offline",
        WANDB_DIR=str(work / "wandb"),
        MLFLOW_TRACKING_URI=f"sqlite:///{work / 'mlflow' / 'mlflow.db'}",
        TENSORBOARD_DIR=str(work / "tensorboard"),
    )
    overrides = [
        f"trainer.total_training_steps={STEPS}",
        f"trainer.logger=[{','.join(BACKENDS)}]",
        f"trainer.test_freq={STEPS}",
        f"trainer.log_val_generations={VAL_SAMPLES}",
    ]
    return Prepared(overrides, environ)


def real_run(cli_runs: Mapping) -> RealRun:
    """The ``trackers`` run (a test reading it names it: ``@needs("trackers")``)."""
    run = cli_runs["trackers"]
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
