"""``rollout.skip_rollout``: the first generation is saved, later calls reuse it, validation still generates."""

from __future__ import annotations

import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.config.validate import merged
from verl.utils.rollout_skip import RolloutSkip


class CountingGroup:
    """Stands in for the worker group's bound ``generate_sequences`` (the wrapper only calls it)."""

    def __init__(self):
        self.calls = 0

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls += 1
        return DataProto.from_dict({"responses": torch.full((len(prompts), 2), self.calls)})


def prompts(rows: int, validate: bool = False) -> DataProto:
    return DataProto.from_dict({"input_ids": torch.zeros(rows, 3, dtype=torch.long)}, meta_info={"validate": validate})


def test_generates_once_then_reuses_the_dump(tmp_path):
    config = merged([f"actor_rollout_ref.rollout.skip_dump_dir={tmp_path}", "data.train_batch_size=4"])
    group = CountingGroup()
    RolloutSkip(config, group).wrap_generate_sequences()
    first = group.generate_sequences(prompts(4))
    again = group.generate_sequences(prompts(4))
    assert group.calls == 1 and torch.equal(first.batch["responses"], again.batch["responses"])
    group.generate_sequences(prompts(4, validate=True))
    assert group.calls == 2  # validation is never skipped
    fresh = CountingGroup()  # a second run with the same shape reuses the file
    RolloutSkip(config, fresh).wrap_generate_sequences()
    assert fresh.generate_sequences(prompts(4)).batch["responses"].eq(1).all() and fresh.calls == 0
    with pytest.raises(ValueError, match="holds 4 rows, this call has 2"):
        fresh.generate_sequences(prompts(2))
