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
import re
import shutil
from typing import Any

import torch

__all__ = [
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
