"""BaseCheckpointManager: which parts a config asks for, LoRA-only state dicts, and rotation that never removes the
previous checkpoint before the new one is written."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from verl.utils.checkpoint.checkpoint_manager import BaseCheckpointManager


def _manager(config=None) -> BaseCheckpointManager:
    return BaseCheckpointManager(model=object(), optimizer=None, checkpoint_config=config)


def _folders(tmp_path, *steps):
    out = []
    for step in steps:
        path = tmp_path / f"global_step_{step}"
        path.mkdir()
        out.append(str(path))
    return out


def test_contents_default_to_model_optimizer_extra_and_follow_the_config():
    default = _manager()
    assert (default.should_save_model, default.should_save_optimizer, default.should_save_extra) == (True,) * 3
    assert not default.should_save_hf_model and not default.should_load_hf_model and not default.should_save_lora_only
    assert (default.rank, default.world_size) == (0, 1)  # no process group
    chosen = _manager({"save_contents": ["model", "hf_model"], "load_contents": ["optimizer"], "save_lora_only": True})
    assert chosen.should_save_hf_model and not chosen.should_save_optimizer and not chosen.should_save_extra
    assert chosen.should_load_optimizer and not chosen.should_load_model and not chosen.should_load_extra
    assert chosen.should_save_lora_only
    # a config object without the key (our CheckpointConfig) reads as False
    assert _manager(SimpleNamespace(get=lambda key, default=None: default)).should_save_lora_only is False


def test_lora_only_state_dict_needs_every_key_to_be_an_adapter():
    is_lora = BaseCheckpointManager.is_lora_only_state_dict
    assert is_lora({"a.q.lora_A.weight": 1, "a.q.lora_B.weight": 2, "b.adapter_A.weight": 3})
    assert not is_lora({"a.q.lora_A.weight": 1, "a.q.weight": 2})
    assert not is_lora({}) and not is_lora(None)


def test_keep_one_removes_the_old_checkpoint_only_after_the_new_one_is_registered(tmp_path):
    mgr = _manager()
    old, new = _folders(tmp_path, 1, 2)
    mgr.register_checkpoint(old, 1)
    mgr.ensure_checkpoint_capacity(1)  # before the save of step 2: step 1 is all we have, keep it
    assert os.path.isdir(old)
    mgr.register_checkpoint(new, 1)
    assert not os.path.exists(old) and os.path.isdir(new) and mgr.previous_saved_paths == [new]


def test_keep_three_frees_one_slot_before_a_save_and_zero_keeps_all(tmp_path):
    a, b, c, d = _folders(tmp_path, 1, 2, 3, 4)
    mgr = _manager()
    mgr.previous_saved_paths = [a, b, c]
    mgr.ensure_checkpoint_capacity(3)  # 3 kept, 1 to come: the oldest goes, 2 remain
    assert not os.path.exists(a) and mgr.previous_saved_paths == [b, c]
    keep_all = _manager()
    keep_all.previous_saved_paths = [b, c]
    keep_all.ensure_checkpoint_capacity(0)
    keep_all.register_checkpoint(d, None)
    assert all(os.path.isdir(p) for p in (b, c, d)) and keep_all.previous_saved_paths == [b, c, d]


def test_saving_the_same_path_again_counts_once_and_is_not_removed(tmp_path):
    (a,) = _folders(tmp_path, 1)
    mgr = _manager()
    mgr.register_checkpoint(a, 1)
    mgr.register_checkpoint(a, 1)
    assert os.path.isdir(a) and mgr.previous_saved_paths == [a]


def test_checkpath_prefers_the_local_path_and_needs_one():
    assert BaseCheckpointManager.checkpath("/l", "/h") == (True, "/l")
    assert BaseCheckpointManager.checkpath(None, "/h") == (False, "/h")
    with pytest.raises(ValueError, match="cannot be both None"):
        BaseCheckpointManager.checkpath(None, None)


def test_rng_state_round_trips():
    import random

    import torch

    state = BaseCheckpointManager.get_rng_state()
    first = (torch.rand(1).item(), random.random())
    BaseCheckpointManager.load_rng_state(state)
    assert (torch.rand(1).item(), random.random()) == first
