"""Metric sinks behind one small interface, chosen by ``trainer.logger`` (veRL's ``Tracking``).

``Tracking(project_name, experiment_name, default_backend, config)`` opens the named backends, ``log(data, step)``
sends a step's metrics to all of them (numpy scalars and 0-d tensors become floats), ``finish(exit_code=None)``
closes them (calling it again does nothing; a non-zero ``exit_code`` marks the wandb / mlflow run failed). The
resolved ``config`` is logged once, at start-up / step 0:

- ``console``: ``step:N - key:value - ...`` lines through the ``verl.console`` logger; the config as YAML (INFO).
- ``file``: veRL's jsonl at ``$VERL_FILE_LOGGER_PATH`` or ``<project>/<experiment>.jsonl``, one
  ``{"step": N, "data": {...}}`` line per ``log``. The config is the first line, ``{"step": 0, "data": {},
  "config": {...}}``: readers that do ``record["data"]`` on every line keep working, and its empty ``data`` adds
  no metric (line counts do include it).
- ``tensorboard``: ``$TENSORBOARD_DIR`` or ``tensorboard_log/<project>/<experiment>``; numeric values as scalars
  (others skipped); the config as the text ``config`` at step 0.
- ``wandb``: ``wandb.init(project, name=experiment, config=config)``; offline (``wandb sync`` later) when neither
  ``WANDB_MODE`` nor ``WANDB_API_KEY`` is set, so it never waits on a network; ``WANDB_DIR`` is honoured.
  ``tracking`` is a deprecated alias.
- ``mlflow``: ``$MLFLOW_TRACKING_URI`` or ``sqlite:///<cwd>/mlflow.db`` (MLflow 3's own default, made explicit);
  experiment = project, run name = experiment; metric names MLflow refuses are rewritten (``@`` → ``_at_``, see
  :func:`~verl.utils.tracking.backends.mlflow_key`); the config as flattened params plus ``config.json``.

tensorboard, wandb and mlflow come with ``pip install 'verl[trackers]'``; they are imported only when named, and a
missing one fails when ``Tracking`` is built (before training) with a message naming the package and the extra.
Backends veRL has that are not shipped here (swanlab, clearml, trackio, vemlp_wandb) and unknown names are
refused the same way, listing the available ones. :func:`register_tracker` adds a backend.

:class:`ValidationGenerationsLogger` logs validation samples (:mod:`verl.utils.tracking.validation`);
:class:`DapoFilteredRewardTableLogger` dynamic sampling's dropped groups (:mod:`verl.utils.tracking.tables`).
"""

from verl.utils.tracking import backends as _backends  # noqa: F401 - registers tensorboard, wandb, mlflow
from verl.utils.tracking.core import Tracking, available_backends, register_tracker
from verl.utils.tracking.tables import DapoFilteredRewardTableLogger
from verl.utils.tracking.validation import ValidationGenerationsLogger

__all__ = [
    "DapoFilteredRewardTableLogger",
    "Tracking",
    "ValidationGenerationsLogger",
    "available_backends",
    "register_tracker",
]
