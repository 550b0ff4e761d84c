"""Schema of ``*.checkpoint`` (what a role saves and loads)."""

from __future__ import annotations

from dataclasses import dataclass, field

from verl.base_config import BaseConfig

__all__ = ["CHECKPOINT_CONTENTS", "CheckpointConfig"]

CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")


@dataclass
class CheckpointConfig(BaseConfig):
    """``save_contents`` / ``load_contents``: any of model, optimizer, extra (scheduler + RNG), hf_model (a HF
    folder of the weights next to the sharded checkpoint). ``async_save`` is accepted; saves are synchronous.

    Args:
        save_contents: what a checkpoint holds: any of "model", "optimizer", "extra" (lr scheduler and RNG states),
            "hf_model" (a HF folder of the full weights).
        load_contents: what is restored when a checkpoint is loaded.
        async_save: write checkpoints in the background.
    """

    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    async_save: bool = False

    def __post_init__(self) -> None:
        for name in ("save_contents", "load_contents"):
            values = getattr(self, name)
            bad = [v for v in values if v not in CHECKPOINT_CONTENTS]
            if bad:
                raise ValueError(f"checkpoint.{name} has {bad}; allowed: {list(CHECKPOINT_CONTENTS)}")
