"""Checkpoint folders of a training run (see :mod:`verl.utils.checkpoint.checkpoint_manager`)."""

from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path, get_checkpoint_tracker_filename

__all__ = ["find_latest_ckpt_path", "get_checkpoint_tracker_filename"]
