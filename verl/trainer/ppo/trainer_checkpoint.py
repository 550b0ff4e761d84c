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
from verl.utils.rng import get_rng_state, set_rng_state

if TYPE_CHECKING:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

__all__ = ["load_trainer_checkpoint", "resume_folder", "save_trainer_checkpoint"]

logger = logging.getLogger(__name__)


def _roles(trainer: RayPPOTrainer) -> list[str]:
    return ["actor", "critic"] if trainer.critic_wg is not None else ["actor"]


def save_trainer_checkpoint(trainer: RayPPOTrainer, epoch: int) -> str:
    """Write ``global_step_<N>`` for the trainer's current step atomically, point the tracker at it, and rotate old
    checkpoints. Returns the folder."""
    cfg = trainer.config.trainer
    root, step = cfg.default_local_dir, trainer.global_steps
    tmp = begin_save(root, step)
    trainer.actor_rollout_wg.save_checkpoint(os.path.join(tmp, "actor"), global_step=step)
    if trainer.critic_wg is not None:
        trainer.critic_wg.save_checkpoint(os.path.join(tmp, "critic"), global_step=step)
    save_state_file(trainer.train_dataloader.state_dict(), os.path.join(tmp, DATA_FILE))
    state: dict[str, Any] = {
        "global_steps": step,
        "epoch": epoch,
        "kl_coef": None if trainer.kl_ctrl_in_reward is None else trainer.kl_ctrl_in_reward.value,
        "rng": get_rng_state(),
        "roles": _roles(trainer),
    }
    save_state_file(state, os.path.join(tmp, TRAINER_STATE_FILE))
    folder = commit_save(root, step, tmp)
    rotate_checkpoints(root, cfg.get("max_actor_ckpt_to_keep"), cfg.get("max_critic_ckpt_to_keep"))
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


def load_trainer_checkpoint(trainer: RayPPOTrainer) -> int:
    """Resume per ``trainer.resume_mode``: load the workers' states, the dataloader position, the KL coefficient and
    the driver's random states, and set ``trainer.global_steps``. Returns the epoch to continue (0 from scratch)."""
    folder = resume_folder(trainer.config)
    if folder is None:
        return 0
    check_step_folder(folder, _roles(trainer))
    # the driver's files first: a damaged one fails before the workers spend time loading
    data_state = load_state_file(os.path.join(folder, DATA_FILE))
    state = load_state_file(os.path.join(folder, TRAINER_STATE_FILE))
    step = step_of(folder)
    if state.get("global_steps") != step:
        raise ValueError(
            f"checkpoint file {os.path.join(folder, TRAINER_STATE_FILE)} is for step {state.get('global_steps')}, "
            f"its folder for step {step}"
        )
    trainer.actor_rollout_wg.load_checkpoint(os.path.join(folder, "actor"))
    if trainer.critic_wg is not None:
        trainer.critic_wg.load_checkpoint(os.path.join(folder, "critic"))
    trainer.train_dataloader.load_state_dict(data_state)
    if trainer.kl_ctrl_in_reward is not None and state.get("kl_coef") is not None:
        trainer.kl_ctrl_in_reward.value = state["kl_coef"]
    set_rng_state(state["rng"])
    trainer.global_steps = step
    logger.info("resumed from %s (step %d, epoch %d)", folder, step, state["epoch"])
    return int(state["epoch"])
