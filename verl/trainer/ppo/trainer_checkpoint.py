"""Saving and resuming a `RayPPOTrainer` run: what the driver writes next to the workers' sharded states, and how a
run picks up at the same step, epoch, data position and random state.

Keys (``trainer.*``): ``save_freq``, ``default_local_dir``, ``resume_mode`` (``auto``: the tracker file's step,
nothing saved yet → from scratch; ``disable``; ``resume_path``: ``resume_from_path``), ``max_actor_ckpt_to_keep`` /
``max_critic_ckpt_to_keep``. The folder layout and the atomic save are in :mod:`verl.utils.checkpoint`.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from verl.utils.checkpoint.checkpoint_manager import (
    DATA_FILE,
    TRAINER_STATE_FILE,
    begin_save,
    check_step_folder,
    commit_save,
    find_latest_ckpt_path,
    load_state_file,
    rotate_checkpoints,
    save_state_file,
    step_of,
)

if TYPE_CHECKING:
    from verl.trainer.ppo.trainer_state import TrainerState

__all__ = ["TrainerCheckpointing", "load_trainer_checkpoint", "resume_folder", "save_trainer_checkpoint"]

logger = logging.getLogger(__name__)


def save_trainer_checkpoint(trainer_config: Any, state: TrainerState, workers: dict[str, Any]) -> str:
    """Write ``global_step_<state.global_steps>`` atomically: each worker group's sharded state under its role
    (``workers``: ``{"actor": group, "critic": group}``, the roles that run), the data loader's position in
    ``data.pt`` and the rest of ``state`` in ``trainer_state.pt``; point the tracker at it and rotate old
    checkpoints (``trainer.*`` keys of ``trainer_config``). Returns the folder."""
    root, step = trainer_config.default_local_dir, state.global_steps
    tmp = begin_save(root, step)
    for role, group in workers.items():
        group.save_checkpoint(os.path.join(tmp, role), global_step=step)
    snapshot = state.state_dict()
    save_state_file(snapshot.pop("data"), os.path.join(tmp, DATA_FILE))
    save_state_file({**snapshot, "roles": list(workers)}, os.path.join(tmp, TRAINER_STATE_FILE))
    folder = commit_save(root, step, tmp)
    rotate_checkpoints(
        root, trainer_config.get("max_actor_ckpt_to_keep"), trainer_config.get("max_critic_ckpt_to_keep")
    )
    return folder


def resume_folder(config: Any) -> str | None:
    """The checkpoint to resume from under ``trainer.resume_mode``, or None to start from scratch."""
    cfg = config.trainer
    if cfg.resume_mode == "disable":
        return None
    if cfg.resume_mode == "resume_path":
        folder = os.path.abspath(os.path.expanduser(str(cfg.resume_from_path)))
        step_of(folder)  # a global_step_<N> folder (validated before start-up too)
        return folder
    folder = find_latest_ckpt_path(cfg.default_local_dir)
    if folder is None:
        logger.info("no checkpoint under %s: training from scratch", cfg.default_local_dir)
    return folder


def load_trainer_checkpoint(config: Any, state: TrainerState, workers: dict[str, Any]) -> str | None:
    """Resume per ``trainer.resume_mode``: load each worker group's state (``workers`` as for saving) and restore
    ``state`` (counters, KL coefficient, data position, random states). Returns the folder, or None when starting
    from scratch (``state`` untouched)."""
    folder = resume_folder(config)
    if folder is None:
        return None
    check_step_folder(folder, list(workers))
    # the driver's files first: a damaged one fails before the workers spend time loading
    data_state = load_state_file(os.path.join(folder, DATA_FILE))
    saved = load_state_file(os.path.join(folder, TRAINER_STATE_FILE))
    step = step_of(folder)
    if saved.get("global_steps") != step:
        raise ValueError(
            f"checkpoint file {os.path.join(folder, TRAINER_STATE_FILE)} is for step {saved.get('global_steps')}, "
            f"its folder for step {step}"
        )
    for role, group in workers.items():
        group.load_checkpoint(os.path.join(folder, role))
    state.load_state_dict({**saved, "data": data_state})
    logger.info(
        "resumed from %s (step %d, epoch %d, weight version %d)", folder, step, state.epoch, state.weight_version
    )
    return folder


class TrainerCheckpointing:
    """veRL's ``_save_checkpoint`` / ``_load_checkpoint`` of ``RayPPOTrainer``, over the functions above: the trainer
    state (``state``), the worker groups (``actor_rollout_wg``, ``critic_wg``) and, after a resume, the restored
    weights sent to the rollout engines again (``checkpoint_manager``)."""

    config: Any
    state: TrainerState
    prompts: Any
    train_dataloader: Any
    actor_rollout_wg: Any
    critic_wg: Any
    checkpoint_manager: Any
    global_steps: int

    def _save_checkpoint(self, epoch: int | None = None) -> str:
        """Atomically write ``global_step_<N>`` with ``self.state`` (see
        :mod:`verl.trainer.ppo.trainer_checkpoint`). ``epoch`` defaults to the epoch ``fit()`` draws prompts from
        (in a recipe's own ``fit()``, which reads the data loader itself: ``global_steps // len(dataloader)``,
        veRL's rule)."""
        if epoch is not None:
            self.state.epoch = int(epoch)
        elif self.prompts is None:
            self.state.epoch = self.global_steps // len(self.train_dataloader)
        return save_trainer_checkpoint(self.config.trainer, self.state, self._checkpointed_groups())

    def _load_checkpoint(self) -> int:
        """Resume per ``trainer.resume_mode``: restore the workers and ``self.state``, then re-send the restored
        actor's weights to the rollout engines under the restored weight version. Returns the epoch to continue."""
        if load_trainer_checkpoint(self.config, self.state, self._checkpointed_groups()) is not None:
            self.checkpoint_manager.resync_weights()
        return self.state.epoch

    def _checkpointed_groups(self) -> dict[str, Any]:
        groups = {"actor": self.actor_rollout_wg}
        if self.critic_wg is not None:
            groups["critic"] = self.critic_wg
        return groups
