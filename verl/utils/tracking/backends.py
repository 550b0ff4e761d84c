"""The optional backends: ``tensorboard``, ``wandb`` and ``mlflow`` (the ``trackers`` extra), and ``trackio``.

Each imports its package only when it is opened; :class:`~verl.utils.tracking.core.Tracking` checks the packages
named in ``requires`` before opening any backend, so a missing one fails at start-up.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl.utils.tracking.core import config_text, flatten_config, is_number, register_tracker

__all__ = [
    "MlflowLogger",
    "TensorboardLogger",
    "TrackioLogger",
    "WandbLogger",
    "default_mlflow_uri",
    "mlflow_key",
    "tensorboard_dir",
    "wandb_offline_by_default",
]

logger = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------- tensorboard
def tensorboard_dir(project_name: str, experiment_name: str) -> str:
    """``$TENSORBOARD_DIR`` or ``tensorboard_log/<project>/<experiment>`` (veRL's layout)."""
    return os.environ.get("TENSORBOARD_DIR") or os.path.join("tensorboard_log", project_name, experiment_name)


def open_summary_writer(log_dir: str) -> Any:
    """A ``torch.utils.tensorboard.SummaryWriter`` on ``log_dir`` (created)."""
    from torch.utils.tensorboard import SummaryWriter

    os.makedirs(log_dir, exist_ok=True)
    return SummaryWriter(log_dir=log_dir)


def fenced(text: str) -> str:
    """``text`` as a markdown code block that TensorBoard's text plugin shows verbatim."""
    return "\n".join("    " + line for line in text.splitlines())


@register_tracker("tensorboard")
class TensorboardLogger:
    """Scalars (numeric values only) via ``SummaryWriter``; the resolved config as text ``config`` at step 0."""

    requires = (("tensorboard", "tensorboard"),)

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        self.log_dir = tensorboard_dir(project_name, experiment_name)
        self.writer = open_summary_writer(self.log_dir)
        if config is not None:
            self.writer.add_text("config", fenced(config_text(config)), global_step=0)
            self.writer.flush()
        logger.info("tensorboard: writing to %s (view with `tensorboard --logdir %s`)", *[self.log_dir] * 2)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        for key, value in data.items():
            if is_number(value):
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


# --------------------------------------------------------------------------------------------- wandb
def wandb_offline_by_default() -> bool:
    """True when neither ``WANDB_MODE`` nor ``WANDB_API_KEY`` is set: the run is then logged offline."""
    return not os.environ.get("WANDB_MODE") and not os.environ.get("WANDB_API_KEY")


@register_tracker("wandb")
class WandbLogger:
    """``wandb.init(project, name=experiment, config=config)``; offline unless ``WANDB_MODE``/``WANDB_API_KEY`` is
    set (so it never waits on a network). ``WANDB_DIR`` is honoured."""

    requires = (("wandb", "wandb"),)

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        import wandb

        kwargs: dict[str, Any] = {}
        offline = wandb_offline_by_default()
        if offline:
            kwargs["mode"] = "offline"
        if os.environ.get("WANDB_DIR"):
            os.makedirs(os.environ["WANDB_DIR"], exist_ok=True)
            kwargs["dir"] = os.environ["WANDB_DIR"]
        self.run = wandb.init(project=project_name, name=experiment_name, config=config, **kwargs)
        self.run_dir = os.path.dirname(self.run.dir)  # the run's folder (``run.dir`` is its ``files/``)
        if offline:
            logger.info(
                "wandb: neither WANDB_MODE nor WANDB_API_KEY is set, so the run is logged offline to %s; upload it "
                "with `wandb sync %s` (set WANDB_API_KEY or WANDB_MODE=online to log live)",
                self.run_dir,
                self.run_dir,
            )
        self._open = True

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.run.log(dict(data), step=step)

    def finish(self, exit_code: int | None = None) -> None:
        if not self._open:
            return
        self._open = False
        self.run.finish(exit_code=exit_code)
        import wandb

        if wandb.run is None:  # stop wandb's service now rather than in an atexit hook (which, in a Ray actor,
            wandb.teardown()  # may run after the service is gone and print a ConnectionResetError)


# --------------------------------------------------------------------------------------------- mlflow
_MLFLOW_BAD_CHARS = re.compile(r"[^\w\-. /:]")
_MLFLOW_KEY_LIMIT = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH
_MLFLOW_VALUE_FALLBACK_LIMIT = 500  # the smallest param value limit of any mlflow release


def mlflow_key(key: str) -> str:
    """``key`` as a name MLflow accepts, deterministically: ``@`` → ``_at_``, other refused characters → ``_``,
    repeated/leading/trailing ``/`` removed and ``.``/``..`` path segments escaped (MLflow wants normalised paths),
    cut to 250 characters."""
    name = _MLFLOW_BAD_CHARS.sub("_", key.replace("@", "_at_"))
    segments = [seg for seg in name.split("/") if seg]
    name = "/".join("_" * len(seg) if seg in (".", "..") else seg for seg in segments)
    return name[:_MLFLOW_KEY_LIMIT] or "_"


def default_mlflow_uri() -> str:
    """``$MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlflow.db``: the local store MLflow 3 itself defaults to,
    made absolute so it does not depend on later ``chdir`` calls."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{os.path.abspath('mlflow.db')}"


def _mlflow_value_limit() -> int:
    try:
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH

        return int(MAX_PARAM_VAL_LENGTH)
    except (ImportError, AttributeError, TypeError, ValueError):
        return _MLFLOW_VALUE_FALLBACK_LIMIT


def _param_value(value: Any, limit: int) -> str:
    """``value`` as an MLflow param string, cut to ``limit`` characters with a visible ``...[truncated]`` tail."""
    import json

    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if len(text) <= limit:
        return text
    tail = "...[truncated]"
    return text[: max(limit - len(tail), 0)] + tail


def _artifact_location(uri: str) -> str | None:
    """For a local ``sqlite:///`` store: ``<the db's folder>/mlruns`` (MLflow would use ``./mlruns`` of the cwd)."""
    if not uri.startswith("sqlite:///"):
        return None
    db = uri[len("sqlite:///") :]
    return Path(os.path.dirname(os.path.abspath(db)), "mlruns").as_uri()


def _experiment_id(mlflow: Any, name: str, uri: str) -> str:
    """The id of experiment ``name``, created (artifacts next to a local store) when it does not exist."""
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return mlflow.create_experiment(name, artifact_location=_artifact_location(uri))
    except mlflow.exceptions.MlflowException:  # created meanwhile by another process
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


@register_tracker("mlflow")
class MlflowLogger:
    """MLflow: experiment = project, run name = experiment; numeric metrics under :func:`mlflow_key` names; the
    config as flattened params (values cut to MLflow's length limit) and whole as the ``config.json`` artifact."""

    requires = (("mlflow", "mlflow"),)

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        import mlflow

        self.uri = default_mlflow_uri()
        if self.uri.startswith("sqlite:///"):  # sqlite creates the file, not its folder
            os.makedirs(os.path.dirname(os.path.abspath(self.uri[len("sqlite:///") :])), exist_ok=True)
        mlflow.set_tracking_uri(self.uri)
        experiment = mlflow.set_experiment(experiment_id=_experiment_id(mlflow, project_name, self.uri))
        run = mlflow.start_run(run_name=experiment_name, nested=mlflow.active_run() is not None)
        self.run_id = run.info.run_id
        self._open = True
        logger.info(
            "mlflow: run %s (experiment %r) in %s, artifacts in %s; browse with `mlflow ui --backend-store-uri %s`",
            self.run_id,
            project_name,
            self.uri,
            experiment.artifact_location,
            self.uri,
        )
        if config is not None:
            self._log_config(config)

    def _log_config(self, config: Any) -> None:
        import mlflow

        limit = _mlflow_value_limit()
        params: dict[str, str] = {}
        for key, value in flatten_config(config).items():
            params.setdefault(mlflow_key(key), _param_value(value, limit))
        mlflow.log_params(params, run_id=self.run_id)
        mlflow.log_dict(config if isinstance(config, Mapping) else {"config": config}, "config.json", self.run_id)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        import mlflow

        metrics = {mlflow_key(key): float(value) for key, value in data.items() if is_number(value)}
        if metrics:
            mlflow.log_metrics(metrics, step=step, run_id=self.run_id)

    def finish(self, exit_code: int | None = None) -> None:
        if not self._open:
            return
        self._open = False
        import mlflow

        status = "FAILED" if exit_code else "FINISHED"
        active = mlflow.active_run()
        if active is not None and active.info.run_id == self.run_id:
            mlflow.end_run(status=status)
        else:
            mlflow.MlflowClient().set_terminated(self.run_id, status=status)


# --------------------------------------------------------------------------------------------- trackio
@register_tracker("trackio")
class TrackioLogger:
    """``trackio.init(project, name=experiment, config=config)`` unless a trackio run is already open in this process
    (then it logs into that one); trackio stores runs locally (``TRACKIO_DIR``) and serves them with
    ``trackio show``. Not in the ``trackers`` extra: ``pip install trackio``."""

    requires = (("trackio", "trackio"),)

    def __init__(self, project_name: str, experiment_name: str, config: Any = None) -> None:
        import trackio
        from trackio import context_vars

        self.trackio = trackio
        if context_vars.current_run.get() is None:
            trackio.init(project=project_name, name=experiment_name, config=config)

    def log(self, data: Mapping[str, Any], step: int) -> None:
        self.trackio.log(dict(data), step=step)

    def finish(self) -> None:
        from trackio import context_vars

        if context_vars.current_run.get() is not None:
            self.trackio.finish()
