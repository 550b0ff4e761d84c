"""``actor_rollout_ref.rollout.skip_rollout``: generate once, then reuse that generation (debugging and timing the
training side without the rollout), at veRL's import path.

:class:`RolloutSkip` wraps a worker group's ``generate_sequences``: the first call of a run with a given shape
(project, experiment, prompts per batch, ``rollout.n``, prompt and response lengths) generates and saves the output
under ``rollout.skip_dump_dir``; every later call — in this run or the next — returns that saved output instead of
generating. The responses then no longer match the step's prompts: only use it to debug or time.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from verl.protocol import DataProto

__all__ = ["RolloutSkip"]

logger = logging.getLogger(__name__)


class RolloutSkip:
    """Reuse one saved generation for every ``generate_sequences`` call of ``rollout_wg``.

    Args:
        config: the trainer config (``actor_rollout_ref.rollout.skip_dump_dir``, sizes and names for the file).
        rollout_wg: the worker group whose ``generate_sequences`` is wrapped.
    """

    def __init__(self, config: Any, rollout_wg: Any) -> None:
        rollout, data, trainer = config.actor_rollout_ref.rollout, config.data, config.trainer
        shape = f"GBS{data.train_batch_size}__N{rollout.n}__in{data.max_prompt_length}_out{data.max_response_length}"
        folder = Path(rollout.skip_dump_dir) / trainer.project_name / trainer.experiment_name / shape
        self.dump_file = folder / "genbatch.dp"
        self.rollout_wg = rollout_wg
        self._generate = None

    def wrap_generate_sequences(self) -> None:
        """Replace ``rollout_wg.generate_sequences`` with the dump-or-reuse wrapper (once)."""
        if self._generate is not None:
            return
        self._generate = self.rollout_wg.generate_sequences

        def generate_sequences(prompts: DataProto, *args: Any, **kwargs: Any) -> DataProto:
            if prompts.meta_info.get("validate", False):  # validation always generates
                return self._generate(prompts, *args, **kwargs)
            if self.dump_file.exists():
                saved = DataProto.load_from_disk(self.dump_file)
                if len(saved) != len(prompts):
                    raise ValueError(
                        f"rollout.skip_rollout: {self.dump_file} holds {len(saved)} rows, this call has {len(prompts)}"
                        "; delete the file or change rollout.skip_dump_dir"
                    )
                return saved
            output = self._generate(prompts, *args, **kwargs)
            os.makedirs(self.dump_file.parent, exist_ok=True)
            output.save_to_disk(self.dump_file)
            logger.warning("rollout.skip_rollout: saved this generation to %s; later steps reuse it", self.dump_file)
            return output

        self.rollout_wg.generate_sequences = generate_sequences
