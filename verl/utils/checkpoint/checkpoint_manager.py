"""The trainer's checkpoint folder: atomic saves, the tracker file, rotation, and finding what to resume from.

Layout (veRL's)::

    <default_local_dir>/
        global_step_<N>/
            actor/ critic/          each role's sharded state (see verl.workers.engine.checkpoint) + huggingface/
            data.pt                 the train dataloader's state_dict()
            trainer_state.pt        the driver's own state (step, epoch, KL coefficient, random states)
        latest_checkpointed_iteration.txt     the last complete step, written last

A save goes into ``.tmp_global_step_<N>`` first and is renamed into place when every part is written; the tracker
file is replaced (write + rename) after that. A crash at any point leaves the previous checkpoint and the tracker
as they were; the stale temporary folder is removed by the next save.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

__all__ = [
    "BaseCheckpointManager",
    "CHECKPOINT_PREFIX",
    "DATA_FILE",
    "TRAINER_STATE_FILE",
    "begin_save",
    "check_step_folder",
    "commit_save",
    "find_latest_ckpt_path",
    "get_checkpoint_tracker_filename",
    "list_step_folders",
    "load_state_file",
    "rotate_checkpoints",
    "save_state_file",
    "should_save_ckpt_esi",
    "step_of",
]

logger = logging.getLogger(__name__)

CHECKPOINT_PREFIX = "global_step_"
TRACKER_FILE = "latest_checkpointed_iteration.txt"
DATA_FILE = "data.pt"
TRAINER_STATE_FILE = "trainer_state.pt"
TMP_PREFIX = ".tmp_"
OLD_PREFIX = ".old_"
_STEP_FOLDER = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")
# Unix time at which the machines are taken back (veRL's names): Volcano Engine ML platform, AWS SageMaker.
ESI_EXPIRATION_ENV_MLP = "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"
ESI_EXPIRATION_ENV_AWS = "SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"


def get_checkpoint_tracker_filename(root: str) -> str:
    """The tracker file of a checkpoint root: it holds the last complete step as a plain integer."""
    return os.path.join(root, TRACKER_FILE)


def step_of(folder: str) -> int:
    """The step of a ``global_step_<N>`` folder; ValueError for any other name."""
    match = _STEP_FOLDER.match(os.path.basename(os.path.normpath(folder)))
    if match is None:
        raise ValueError(f"{folder} is not a {CHECKPOINT_PREFIX}<N> checkpoint folder")
    return int(match.group(1))


def _recover_swap(root: str) -> None:
    """Undo half of an interrupted re-save of an existing step: an ``.old_global_step_<N>`` whose
    ``global_step_<N>`` is missing goes back into place (the new one never got published)."""
    if not os.path.isdir(root):
        return
    for name in os.listdir(root):
        if name.startswith(OLD_PREFIX + CHECKPOINT_PREFIX):
            final = os.path.join(root, name[len(OLD_PREFIX) :])
            if not os.path.exists(final):
                logger.warning("restoring %s: a save of the same step was interrupted", final)
                os.replace(os.path.join(root, name), final)


def find_latest_ckpt_path(root: str) -> str | None:
    """The folder the tracker file names, or None when there is no tracker (nothing saved yet).

    A tracker that is unreadable or names a missing folder is an error naming the file: resuming from an older
    step instead would silently repeat training.
    """
    tracker = get_checkpoint_tracker_filename(root)
    if not os.path.isfile(tracker):
        return None
    _recover_swap(root)
    with open(tracker, encoding="utf-8") as f:
        text = f.read().strip()
    if not text.isdigit():
        raise ValueError(f"checkpoint tracker {tracker} is corrupt: {text[:40]!r} is not a step number")
    folder = os.path.join(root, f"{CHECKPOINT_PREFIX}{int(text)}")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"checkpoint tracker {tracker} names step {text}, but {folder} does not exist")
    return folder


def list_step_folders(root: str) -> list[tuple[int, str]]:
    """``(step, folder)`` of every complete ``global_step_<N>`` folder under ``root``, oldest first."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        match = _STEP_FOLDER.match(name)
        if match and os.path.isdir(os.path.join(root, name)):
            out.append((int(match.group(1)), os.path.join(root, name)))
    return sorted(out)


def begin_save(root: str, step: int) -> str:
    """A fresh temporary folder for the checkpoint of ``step`` (stale temporary folders of earlier crashes are
    removed first)."""
    os.makedirs(root, exist_ok=True)
    _recover_swap(root)
    for name in os.listdir(root):
        if name.startswith((TMP_PREFIX, OLD_PREFIX)):
            logger.warning("removing %s, left by an interrupted save", os.path.join(root, name))
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    tmp = os.path.join(root, f"{TMP_PREFIX}{CHECKPOINT_PREFIX}{step}")
    os.makedirs(tmp)
    return tmp


def _fsync_tree(folder: str) -> None:
    """Flush every file of ``folder`` to disk, so that the rename below never publishes half-written data."""
    for dirpath, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())


def commit_save(root: str, step: int, tmp: str) -> str:
    """Publish the temporary folder of ``step`` as ``global_step_<step>`` and then point the tracker at it.
    Returns the final folder."""
    final = os.path.join(root, f"{CHECKPOINT_PREFIX}{step}")
    _fsync_tree(tmp)
    old = None
    if os.path.exists(final):  # the same step saved again (a resumed run): swap, then drop the old one
        old = os.path.join(root, f"{OLD_PREFIX}{CHECKPOINT_PREFIX}{step}")
        os.replace(final, old)
    os.replace(tmp, final)
    tracker = get_checkpoint_tracker_filename(root)
    with open(tracker + ".tmp", "w", encoding="utf-8") as f:
        f.write(str(step))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tracker + ".tmp", tracker)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("saved checkpoint %s", final)
    return final


def rotate_checkpoints(root: str, max_actor: int | None, max_critic: int | None) -> list[str]:
    """Keep the newest ``max_actor`` actor and ``max_critic`` critic checkpoints (None: all); a step folder left
    with neither role is removed whole. The folder the tracker names is never touched. Returns what was removed."""
    protected = find_latest_ckpt_path(root)
    folders = [folder for _, folder in list_step_folders(root)]
    removed = []
    for role, keep in (("actor", max_actor), ("critic", max_critic)):
        if keep is None:
            continue
        with_role = [f for f in folders if os.path.isdir(os.path.join(f, role))]
        for folder in with_role[: max(0, len(with_role) - keep)]:
            if folder != protected:
                shutil.rmtree(os.path.join(folder, role))
                removed.append(os.path.join(folder, role))
    for folder in folders:
        if folder != protected and not any(os.path.isdir(os.path.join(folder, r)) for r in ("actor", "critic")):
            shutil.rmtree(folder)
            removed.append(folder)
    if removed:
        logger.info("checkpoint rotation removed %s", ", ".join(removed))
    return removed


def save_state_file(obj: Any, file: str) -> None:
    """``torch.save`` through a temporary file and a rename."""
    torch.save(obj, file + ".tmp")
    os.replace(file + ".tmp", file)


def load_state_file(file: str, weights_only: bool = False) -> Any:
    """``torch.load`` of a checkpoint's state file onto the CPU, with errors that name it. ``weights_only=False``
    (the default) for the files that hold random states and dataloader state: numpy arrays and tuples too."""
    if not os.path.isfile(file):
        raise FileNotFoundError(f"checkpoint file {file} is missing (an incomplete or foreign checkpoint?)")
    try:
        return torch.load(file, map_location="cpu", weights_only=weights_only)
    except Exception as e:  # unpickling raises many types
        raise ValueError(f"checkpoint file {file} is corrupt: torch.load failed ({type(e).__name__}: {e})") from e


def check_step_folder(folder: str, roles: list[str]) -> None:
    """Raise FileNotFoundError naming the first missing part of a step folder (the roles' folders, data.pt,
    trainer_state.pt) before any worker starts loading."""
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"checkpoint folder {folder} does not exist")
    for part in [*roles, DATA_FILE, TRAINER_STATE_FILE]:
        if not os.path.exists(os.path.join(folder, part)):
            raise FileNotFoundError(f"checkpoint {folder} has no {part} (written by a run with other roles?)")


def should_save_ckpt_esi(max_steps_duration: float, save_ckpt_duration: float = 60, redundant_time: float = 0) -> bool:
    """Whether to save now because the capacity block expires before another step and a save would finish.

    The expiration (Unix seconds) comes from ``MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP`` (checked first) or
    ``SAGEMAKER_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP``; with neither set, False. With ``budget =
    save_ckpt_duration + max_steps_duration + redundant_time`` (seconds: a save, the longest step so far, a margin)
    and ``remaining`` the seconds left: the MLP rule is ``0 < remaining <= budget and max_steps_duration > 0``; the
    SageMaker rule is ``remaining < budget`` (also once expired), as veRL decides. A value that is not a number gives
    False with a warning (veRL raises for SageMaker's).
    """
    budget = save_ckpt_duration + max_steps_duration + redundant_time
    for name in (ESI_EXPIRATION_ENV_MLP, ESI_EXPIRATION_ENV_AWS):
        raw = os.environ.get(name)
        if not raw:
            continue
        try:
            remaining = float(raw) - time.time()
        except ValueError:
            logger.warning("%s=%r is not a Unix timestamp; not saving for capacity expiration", name, raw)
            return False
        if name == ESI_EXPIRATION_ENV_MLP:
            return 0 < remaining <= budget and max_steps_duration > 0
        return remaining < budget
    return False


_DEFAULT_CONTENTS = ("model", "optimizer", "extra")


def is_peft_adapter_key(key: str) -> bool:
    """True for any peft adapter tensor's key (LoRA matrices and embeddings, other adapter layers)."""
    return "lora_" in key or ".adapter_" in key


class BaseCheckpointManager:
    """veRL's base of the per-role checkpoint managers a recipe builds (``FSDPCheckpointManager``).

    It holds the objects to save, which parts ``checkpoint_config`` asks for (``save_contents`` /
    ``load_contents``, each defaulting to model, optimizer and extra; ``save_lora_only``), and the rotation of the
    folders this manager saved: :meth:`ensure_checkpoint_capacity` before a save frees room but always leaves at
    least one earlier checkpoint, :meth:`register_checkpoint` after it drops what exceeds ``max_ckpt_to_keep``
    (0 or None: keep all) — so with ``max_ckpt_to_keep=1`` the old checkpoint is only removed once the new one is
    written. Subclasses implement :meth:`save_checkpoint` and :meth:`load_checkpoint`.
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any = None,
        lr_scheduler: Any = None,
        processing_class: Any = None,
        checkpoint_config: Any = None,
    ) -> None:
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.processing_class = processing_class
        self.checkpoint_config = checkpoint_config
        load = checkpoint_config.get("load_contents", None) if checkpoint_config else None
        save = checkpoint_config.get("save_contents", None) if checkpoint_config else None
        self.checkpoint_load_contents: list[str] = list(load) if load is not None else list(_DEFAULT_CONTENTS)
        self.checkpoint_save_contents: list[str] = list(save) if save is not None else list(_DEFAULT_CONTENTS)
        self.previous_global_step: int | None = None
        self.previous_saved_paths: list[str] = []
        initialized = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if initialized else 0
        self.world_size = dist.get_world_size() if initialized else 1

    @property
    def should_save_model(self) -> bool:
        """Whether "model" is in ``save_contents``."""
        return "model" in self.checkpoint_save_contents

    @property
    def should_save_optimizer(self) -> bool:
        """Whether "optimizer" is in ``save_contents``."""
        return "optimizer" in self.checkpoint_save_contents

    @property
    def should_save_extra(self) -> bool:
        """Whether "extra" (lr scheduler, random states) is in ``save_contents``."""
        return "extra" in self.checkpoint_save_contents

    @property
    def should_save_hf_model(self) -> bool:
        """Whether "hf_model" (full Hugging Face weights under ``huggingface/``) is in ``save_contents``."""
        return "hf_model" in self.checkpoint_save_contents

    @property
    def should_save_lora_only(self) -> bool:
        """``checkpoint_config.save_lora_only`` (False without a config)."""
        if not self.checkpoint_config:
            return False
        if isinstance(self.checkpoint_config, dict):
            return bool(self.checkpoint_config.get("save_lora_only", False))
        return bool(getattr(self.checkpoint_config, "save_lora_only", False))

    @property
    def should_load_model(self) -> bool:
        """Whether "model" is in ``load_contents``."""
        return "model" in self.checkpoint_load_contents

    @property
    def should_load_optimizer(self) -> bool:
        """Whether "optimizer" is in ``load_contents``."""
        return "optimizer" in self.checkpoint_load_contents

    @property
    def should_load_extra(self) -> bool:
        """Whether "extra" is in ``load_contents``."""
        return "extra" in self.checkpoint_load_contents

    @property
    def should_load_hf_model(self) -> bool:
        """Whether "hf_model" is in ``load_contents``."""
        return "hf_model" in self.checkpoint_load_contents

    @staticmethod
    def is_lora_only_state_dict(state_dict: dict[str, Any] | None) -> bool:
        """True when every key of a non-empty state dict is a LoRA / adapter weight (``lora_`` or ``.adapter_``)."""
        return bool(state_dict) and all(is_peft_adapter_key(k) for k in state_dict)

    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """Save this role's state under ``local_path`` (subclasses)."""
        raise NotImplementedError

    def load_checkpoint(
        self, local_path: str | None, hdfs_path: str | None = None, del_local_after_load: bool = False
    ) -> None:
        """Load what :meth:`save_checkpoint` wrote (subclasses)."""
        raise NotImplementedError

    @staticmethod
    def checkpath(local_path: str | None, hdfs_path: str | None) -> tuple[bool, str]:
        """``(is_local, path)``: the local path when given, else the remote one; ValueError with neither."""
        if local_path is None and hdfs_path is None:
            raise ValueError("local_path and hdfs_path cannot be both None")
        return local_path is not None, local_path if local_path is not None else hdfs_path

    def remove_previous_save_local_path(self, path: str | list[str]) -> None:
        """Remove one or more checkpoint folders (missing ones are skipped)."""
        for p in [path] if isinstance(path, str) else path:
            if os.path.exists(p):
                logger.info("removing checkpoint %s", os.path.abspath(p))
                shutil.rmtree(p, ignore_errors=True)

    @staticmethod
    def _limit(max_ckpt_to_keep: int | None) -> int:
        return max_ckpt_to_keep if isinstance(max_ckpt_to_keep, int) and max_ckpt_to_keep > 0 else 0

    def ensure_checkpoint_capacity(self, max_ckpt_to_keep: int | None) -> None:
        """Before a save: keep the newest ``max_ckpt_to_keep - 1`` saved folders (nothing removed for 1 or 0)."""
        keep = self._limit(max_ckpt_to_keep) - 1
        if keep >= 1 and len(self.previous_saved_paths) > keep:
            self.remove_previous_save_local_path(self.previous_saved_paths[:-keep])
            self.previous_saved_paths = self.previous_saved_paths[-keep:]

    def register_checkpoint(self, new_path: str, max_ckpt_to_keep: int | None) -> None:
        """After a save: record ``new_path`` and remove the oldest folders beyond ``max_ckpt_to_keep`` (a path
        saved again counts once, as the newest)."""
        new_abs = os.path.abspath(new_path)
        self.previous_saved_paths = [p for p in self.previous_saved_paths if os.path.abspath(p) != new_abs]
        self.previous_saved_paths.append(new_path)
        keep = self._limit(max_ckpt_to_keep)
        if keep and len(self.previous_saved_paths) > keep:
            self.remove_previous_save_local_path(self.previous_saved_paths[:-keep])
            self.previous_saved_paths = self.previous_saved_paths[-keep:]

    @staticmethod
    def get_rng_state() -> dict[str, Any]:
        """The random states of torch (CPU, and CUDA when available), numpy and ``random``."""
        state = {"cpu": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state()
        return state

    @staticmethod
    def load_rng_state(rng_state: dict[str, Any]) -> None:
        """Restore what :meth:`get_rng_state` returned."""
        torch.set_rng_state(rng_state["cpu"])
        np.random.set_state(rng_state["numpy"])
        random.setstate(rng_state["random"])
        if "cuda" in rng_state and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng_state["cuda"])
