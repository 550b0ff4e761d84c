"""Running the trainers' command lines from an example script: one stage per subprocess, its metrics read back.

The examples that chain runs (SFT, then RL from its checkpoint) call :func:`run_module` for each stage; a stage that
fails stops the script with the end of its log. :func:`read_metrics` reads the file logger's JSON lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["read_metrics", "run_module"]


def run_module(module: str, cwd: Path, log: Path, *overrides: str) -> None:
    """``python -m <module> <overrides>`` in ``cwd`` (its output in ``cwd/output.log``), its file logger writing to
    ``log``; raises ``SystemExit`` with the end of the output if it fails."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(log), "HYDRA_FULL_ERROR": "1"}
    with open(cwd / "output.log", "w") as out:
        proc = subprocess.run([sys.executable, "-m", module, *overrides], cwd=cwd, env=env, stdout=out, stderr=out)
    if proc.returncode != 0:
        tail = (cwd / "output.log").read_text()[-4000:]
        raise SystemExit(f"{module} failed ({proc.returncode}); the end of {cwd / 'output.log'}:\n{tail}")


def read_metrics(log: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(step, metrics)`` for each record of a file logger's JSON lines."""
    records = []
    for line in Path(log).read_text().splitlines():
        record = json.loads(line)
        records.append((record["step"], record.get("data") or {}))
    return records
