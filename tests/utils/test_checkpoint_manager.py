"""The checkpoint folder's contract: an interrupted save (a process killed mid-write) leaves the previous checkpoint
and the tracker intact; rotation keeps the newest; a broken tracker or file is an error that names it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from verl.utils.checkpoint.checkpoint_manager import (
    DATA_FILE,
    TRAINER_STATE_FILE,
    begin_save,
    check_step_folder,
    commit_save,
    find_latest_ckpt_path,
    get_checkpoint_tracker_filename,
    list_step_folders,
    load_state_file,
    rotate_checkpoints,
    save_state_file,
    step_of,
)


def write_step(root: Path, step: int, roles=("actor", "critic")) -> str:
    tmp = begin_save(str(root), step)
    for role in roles:
        os.makedirs(os.path.join(tmp, role))
        torch.save({"w": torch.full((4,), float(step))}, os.path.join(tmp, role, "weights.pt"))
    save_state_file({"step": step}, os.path.join(tmp, DATA_FILE))
    save_state_file({"global_steps": step}, os.path.join(tmp, TRAINER_STATE_FILE))
    return commit_save(str(root), step, tmp)


def test_save_publishes_the_folder_then_the_tracker(tmp_path):
    assert find_latest_ckpt_path(str(tmp_path)) is None  # nothing saved: train from scratch
    folder = write_step(tmp_path, 3)
    assert folder == str(tmp_path / "global_step_3") and step_of(folder) == 3
    assert find_latest_ckpt_path(str(tmp_path)) == folder
    assert Path(get_checkpoint_tracker_filename(str(tmp_path))).read_text() == "3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3", "latest_checkpointed_iteration.txt"]
    # saving the same step again (a resumed run) replaces it whole
    write_step(tmp_path, 3, roles=("actor",))
    assert not (tmp_path / "global_step_3" / "critic").exists()
    check_step_folder(folder, ["actor"])


def test_a_save_killed_mid_write_leaves_the_previous_checkpoint(tmp_path):
    write_step(tmp_path, 1)
    before = torch.load(tmp_path / "global_step_1" / "actor" / "weights.pt")
    # another process starts the save of step 2, writes part of it, and is killed (SIGKILL: no clean-up at all)
    script = textwrap.dedent(
        f"""
        import os, time, torch
        from verl.utils.checkpoint.checkpoint_manager import begin_save
        tmp = begin_save({str(tmp_path)!r}, 2)
        os.makedirs(os.path.join(tmp, "actor"))
        torch.save({{"w": torch.zeros(4)}}, os.path.join(tmp, "actor", "weights.pt"))
        with open(os.path.join(tmp, "actor", "half.bin"), "wb") as f:
            f.write(b"x" * 1000)
            f.flush()
            print("written", flush=True)
            time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "written"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (tmp_path / ".tmp_global_step_2").is_dir()  # the partial save is there, unpublished
    assert find_latest_ckpt_path(str(tmp_path)) == str(tmp_path / "global_step_1")
    assert [step for step, _ in list_step_folders(str(tmp_path))] == [1]
    after = torch.load(tmp_path / "global_step_1" / "actor" / "weights.pt")
    assert torch.equal(before["w"], after["w"])
    check_step_folder(str(tmp_path / "global_step_1"), ["actor", "critic"])
    # the next save removes the leftovers and completes
    write_step(tmp_path, 2)
    assert not (tmp_path / ".tmp_global_step_2").exists()
    assert find_latest_ckpt_path(str(tmp_path)) == str(tmp_path / "global_step_2")


def test_an_interrupted_resave_of_the_same_step_keeps_the_old_one(tmp_path):
    write_step(tmp_path, 5)
    # a crash between the two renames of a re-save: the old folder moved aside, the new one not yet in place
    os.replace(tmp_path / "global_step_5", tmp_path / ".old_global_step_5")
    assert find_latest_ckpt_path(str(tmp_path)) == str(tmp_path / "global_step_5")  # moved back
    check_step_folder(str(tmp_path / "global_step_5"), ["actor", "critic"])
    os.replace(tmp_path / "global_step_5", tmp_path / ".old_global_step_5")
    write_step(tmp_path, 6)  # the next save restores it too, instead of deleting it as a leftover
    assert [step for step, _ in list_step_folders(str(tmp_path))] == [5, 6]


def test_rotation_keeps_the_newest_per_role(tmp_path):
    for step in range(1, 6):
        write_step(tmp_path, step)
    removed = rotate_checkpoints(str(tmp_path), max_actor=2, max_critic=3)
    assert [step for step, _ in list_step_folders(str(tmp_path))] == [3, 4, 5]
    assert not (tmp_path / "global_step_3" / "actor").exists() and (tmp_path / "global_step_3" / "critic").exists()
    assert str(tmp_path / "global_step_1") in removed
    assert rotate_checkpoints(str(tmp_path), None, None) == []  # null: keep everything


def test_rotation_never_removes_the_tracked_checkpoint(tmp_path):
    for step in (1, 2):
        write_step(tmp_path, step)
    # the tracker points at step 1 (e.g. step 2 was copied in by hand); keeping one must not drop the tracked one
    Path(get_checkpoint_tracker_filename(str(tmp_path))).write_text("1")
    rotate_checkpoints(str(tmp_path), max_actor=1, max_critic=1)
    assert (tmp_path / "global_step_1" / "actor").is_dir()


def test_broken_tracker_and_files_are_named(tmp_path):
    tracker = Path(get_checkpoint_tracker_filename(str(tmp_path)))
    tracker.write_text("seven")
    with pytest.raises(ValueError, match="latest_checkpointed_iteration.txt is corrupt"):
        find_latest_ckpt_path(str(tmp_path))
    tracker.write_text("7")
    with pytest.raises(FileNotFoundError, match="global_step_7 does not exist"):
        find_latest_ckpt_path(str(tmp_path))
    folder = write_step(tmp_path, 8, roles=("actor",))
    with pytest.raises(FileNotFoundError, match="has no critic"):
        check_step_folder(folder, ["actor", "critic"])
    Path(folder, DATA_FILE).write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match=f"{DATA_FILE} is corrupt"):
        load_state_file(os.path.join(folder, DATA_FILE))
    os.remove(os.path.join(folder, TRAINER_STATE_FILE))
    with pytest.raises(FileNotFoundError, match=f"{TRAINER_STATE_FILE} is missing"):
        load_state_file(os.path.join(folder, TRAINER_STATE_FILE))
    with pytest.raises(ValueError, match="not a global_step_<N> checkpoint folder"):
        step_of(str(tmp_path / "step_3"))


def test_save_state_file_is_atomic(tmp_path):
    file = tmp_path / "state.pt"
    save_state_file({"a": 1}, str(file))
    os.utime(file, ns=(10**9, 10**9))  # a 1970 mtime: any write to the file, or a file renamed over it, is newer
    before, content = file.stat(), file.read_bytes()

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        save_state_file({"a": Unpicklable()}, str(file))
    after = file.stat()
    assert file.read_bytes() == content and load_state_file(str(file)) == {"a": 1}
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, 10**9)  # the same file, not written to
