"""``DapoFilteredRewardTableLogger``: a wandb table of the prompt groups dynamic sampling dropped, per step.

DAPO's dynamic sampling (``algorithm.filter_groups``) drops the groups whose samples all share one value of the
filter metric; which value (all wrong, all right) says whether the data are too hard or too easy. Each step adds one
row ``step, "value:count, ..."`` (values ascending) to ``training/filter_groups/filtered_reward_counts``. wandb
0.20+ takes the rows incrementally (``log_mode="INCREMENTAL"``); older wandb gets the whole history as a new table
each step. Only wandb shows such a table: the other trackers get the dropped count as the scalar
``training/filter_groups/evicted_samples``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["DapoFilteredRewardTableLogger", "FILTERED_REWARD_TABLE_KEY"]

logger = logging.getLogger(__name__)

FILTERED_REWARD_TABLE_KEY = "training/filter_groups/filtered_reward_counts"
_COLUMNS = ["step", "reward_counts"]
_INCREMENTAL_SINCE = (0, 20)


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


class DapoFilteredRewardTableLogger:
    """Per step, the count of dropped groups per filter-metric value, as a row of a wandb table (veRL 0.10's)."""

    def __init__(self, project_name: str | None = None, experiment_name: str | None = None) -> None:
        self.project_name, self.experiment_name = project_name, experiment_name
        self._table: Any = None
        self._rows: list[list[Any]] | None = None

    def log(self, loggers: Iterable[str], reward_counts: Mapping[Any, int], step: int) -> None:
        """Add ``reward_counts`` (filter-metric value → dropped groups) as the row of ``step`` when ``wandb`` is among
        ``loggers`` and a wandb run is open."""
        if "wandb" not in set(loggers):
            return
        import wandb

        if wandb.run is None:
            logger.warning("the filtered-reward table is not logged: no wandb run is open")
            return
        counts = {float(value): int(count) for value, count in reward_counts.items()}
        text = ", ".join(f"{value:g}:{counts[value]}" for value in sorted(counts))
        if self._table is None and self._rows is None:
            if _version(wandb.__version__) >= _INCREMENTAL_SINCE:
                self._table = wandb.Table(columns=_COLUMNS, log_mode="INCREMENTAL")
            else:
                self._rows = []
                logger.warning(
                    "wandb %s has no incremental tables: the filtered-reward table is re-sent whole each step",
                    wandb.__version__,
                )
        if self._table is not None:
            self._table.add_data(step, text)
            table = self._table
        else:
            self._rows.append([step, text])
            table = wandb.Table(columns=_COLUMNS, data=[list(row) for row in self._rows])
        wandb.log({FILTERED_REWARD_TABLE_KEY: table}, step=step)
