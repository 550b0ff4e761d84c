"""``ValidationGenerationsLogger``: a few validation (input, output, score) samples per validation step.

Per backend named in ``trainer.logger``: ``wandb`` logs a ``val/generations`` table whose rows accumulate across
steps (one row per step: ``step, input_1, output_1, score_1, ...``), ``tensorboard`` a markdown table as text
``val/generations`` at the step, ``mlflow`` the artifact ``val_generations/step_<N>.json``, ``console`` the samples
through logging, ``file`` a ``{"step": N, "val_generations": [...]}`` line in ``<file logger path without .jsonl>
.val_generations.jsonl`` (by default ``<project>/<experiment>.val_generations.jsonl``), and ``trackio`` one chat
trace (input, output; the score as metadata) per sample under ``val/generations``. wandb and mlflow write into the
run that the live ``Tracking`` opened (``wandb.run`` / ``mlflow.active_run()``); the trainer may build a new logger
per validation, so the wandb rows are kept per run.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

from verl.utils.tracking.core import (
    _ALIASES,
    console_logger,
    file_logger_path,
    live_backend,
    require_package,
    to_scalar,
)

__all__ = ["ValidationGenerationsLogger", "val_generations_path"]

logger = logging.getLogger(__name__)

# wandb run id → the rows logged so far (the table is re-logged whole each step, as wandb tables are immutable).
_WANDB_ROWS: dict[str, list[list[Any]]] = {}


def val_generations_path(project_name: str, experiment_name: str) -> str:
    """The ``file`` backend's validation-samples jsonl, next to the metrics jsonl."""
    path = file_logger_path(project_name, experiment_name)
    stem = path[: -len(".jsonl")] if path.endswith(".jsonl") else path
    return f"{stem}.val_generations.jsonl"


def _markdown_cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


class ValidationGenerationsLogger:
    """Log validation samples to the backends that can show them (veRL's interface)."""

    def __init__(self, project_name: str | None = None, experiment_name: str | None = None) -> None:
        self.project_name = project_name or "verl"
        self.experiment_name = experiment_name or "default"

    def log(self, loggers: Iterable[str], samples: Sequence[Sequence[Any]], step: int) -> None:
        """Log ``samples`` (``(input text, output text, score)`` triples) at ``step`` to each backend in
        ``loggers`` that supports it; other names are ignored."""
        rows = [(str(s[0]), str(s[1]), to_scalar(s[2])) for s in samples]
        writers = {
            "wandb": self._wandb,
            "tensorboard": self._tensorboard,
            "mlflow": self._mlflow,
            "console": self._console,
            "file": self._file,
            "trackio": self._trackio,
        }
        done: set[str] = set()
        for name in loggers:
            name = _ALIASES.get(name, name)
            if name in writers and name not in done:
                done.add(name)
                writers[name](rows, step)

    # ------------------------------------------------------------------ backends
    def _wandb(self, rows: list[tuple[str, str, Any]], step: int) -> None:
        wandb = require_package("wandb", "wandb")
        run = wandb.run
        if run is None:
            logger.warning("val generations not logged to wandb: no wandb run is open (is 'wandb' in trainer.logger?)")
            return
        table_rows = _WANDB_ROWS.setdefault(run.id, [])
        table_rows.append([step, *(value for row in rows for value in row)])
        width = max(len(row) for row in table_rows)
        columns = ["step"] + [
            f"{kind}_{i}" for i in range(1, (width - 1) // 3 + 1) for kind in ("input", "output", "score")
        ]
        data = [row + [None] * (width - len(row)) for row in table_rows]
        run.log({"val/generations": wandb.Table(columns=columns, data=data, allow_mixed_types=True)}, step=step)

    def _tensorboard(self, rows: list[tuple[str, str, Any]], step: int) -> None:
        from verl.utils.tracking.backends import open_summary_writer, tensorboard_dir

        lines = ["| # | input | output | score |", "|---|---|---|---|"]
        lines += [
            f"| {i} | {_markdown_cell(a)} | {_markdown_cell(b)} | {_markdown_cell(c)} |"
            for i, (a, b, c) in enumerate(rows, 1)
        ]
        text = "\n".join(lines)
        live = live_backend("tensorboard")
        if live is not None:
            live.writer.add_text("val/generations", text, global_step=step)
            live.writer.flush()
            return
        require_package("tensorboard", "tensorboard")
        writer = open_summary_writer(tensorboard_dir(self.project_name, self.experiment_name))
        try:
            writer.add_text("val/generations", text, global_step=step)
        finally:
            writer.close()

    def _mlflow(self, rows: list[tuple[str, str, Any]], step: int) -> None:
        mlflow = require_package("mlflow", "mlflow")
        run = mlflow.active_run()
        if run is None:
            logger.warning("val generations not logged to mlflow: no run is active (is 'mlflow' in trainer.logger?)")
            return
        payload = {"step": step, "samples": [{"input": a, "output": b, "score": c} for a, b, c in rows]}
        mlflow.log_dict(payload, f"val_generations/step_{step:08d}.json", run_id=run.info.run_id)

    def _trackio(self, rows: list[tuple[str, str, Any]], step: int) -> None:
        trackio = require_package("trackio", "trackio", extra="")
        traces = [
            trackio.Trace(
                messages=[{"role": "user", "content": text_in}, {"role": "assistant", "content": text_out}],
                metadata={"source": "validation_generations", "sample_index": i, "score": score},
            )
            for i, (text_in, text_out, score) in enumerate(rows)
        ]
        if traces:
            trackio.log({"val/generations": traces}, step=step)

    def _console(self, rows: list[tuple[str, str, Any]], step: int) -> None:
        log = console_logger()
        for i, (text_in, text_out, score) in enumerate(rows, 1):
            log.info(
                "[val generations step %d, sample %d] score=%s\n[input] %s\n[output] %s",
                step,
                i,
                score,
                text_in,
                text_out,
            )

    def _file(self, rows: list[tuple[str, str, Any]], step: int) -> None:
        path = val_generations_path(self.project_name, self.experiment_name)
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        record = {"step": step, "val_generations": [{"input": a, "output": b, "score": c} for a, b, c in rows]}
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, default=str) + "\n")
