"""FSDPCheckpointManager with a model not built by our engine: veRL's per-rank files, LoRA-only saves of a PEFT
model, and the errors a wrong folder gives."""

from __future__ import annotations

import json
import os

import pytest
import torch
from peft import LoraConfig, get_peft_model

from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager


class _Net(torch.nn.Module):
    def __init__(self, fill: float):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2, bias=False)
        torch.nn.init.constant_(self.lin.weight, fill)

    def forward(self, x):
        return self.lin(x)


def _peft(fill: float) -> torch.nn.Module:
    return get_peft_model(_Net(fill), LoraConfig(r=2, lora_alpha=4, target_modules=["lin"], lora_dropout=0.0))


def test_model_optimizer_and_scheduler_round_trip_through_per_rank_files(tmp_path):
    model = _Net(1.0)
    optim = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=1, gamma=0.1)
    model(torch.ones(1, 2)).sum().backward()
    optim.step()  # weight 1 - 0.5 * grad 1 = 0.5, momentum buffer 1
    sched.step()  # lr 0.05
    FSDPCheckpointManager(model, optim, sched).save_checkpoint(str(tmp_path), global_step=3)
    names = sorted(os.listdir(tmp_path))
    assert names == [
        "extra_state_world_size_1_rank_0.pt",
        "huggingface",
        "model_world_size_1_rank_0.pt",
        "optim_world_size_1_rank_0.pt",
    ]

    other = _Net(7.0)
    other_optim = torch.optim.SGD(other.parameters(), lr=0.5, momentum=0.9)
    other_sched = torch.optim.lr_scheduler.StepLR(other_optim, step_size=1, gamma=0.1)
    FSDPCheckpointManager(other, other_optim, other_sched).load_checkpoint(str(tmp_path))
    assert torch.equal(other.lin.weight, torch.full((2, 2), 0.5))
    assert torch.equal(other_optim.state[other.lin.weight]["momentum_buffer"], torch.ones(2, 2))
    assert other_sched.last_epoch == 1 and other_optim.param_groups[0]["lr"] == pytest.approx(0.05)


def test_lora_only_save_writes_adapters_and_loading_keeps_the_base(tmp_path):
    model = _peft(1.0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.fill_(0.25)
    config = {"save_contents": ["model"], "save_lora_only": True}
    FSDPCheckpointManager(model, checkpoint_config=config).save_checkpoint(str(tmp_path))
    saved = torch.load(tmp_path / "model_world_size_1_rank_0.pt", weights_only=False)
    assert sorted(saved) == [
        "base_model.model.lin.lora_A.default.weight",
        "base_model.model.lin.lora_B.default.weight",
    ]
    meta = json.loads((tmp_path / "lora_train_meta.json").read_text())
    assert (meta["r"], meta["lora_alpha"]) == (2, 4)

    fresh = _peft(9.0)
    FSDPCheckpointManager(fresh, checkpoint_config={"load_contents": ["model"]}).load_checkpoint(str(tmp_path))
    assert torch.equal(fresh.base_model.model.lin.base_layer.weight, torch.full((2, 2), 9.0))  # base kept
    assert torch.equal(fresh.base_model.model.lin.lora_A["default"].weight, torch.full((2, 2), 0.25))


def test_lora_only_checkpoint_into_a_model_without_those_adapters_is_refused(tmp_path):
    torch.save({"other.lora_A.weight": torch.zeros(1)}, tmp_path / "model_world_size_1_rank_0.pt")
    mgr = FSDPCheckpointManager(_peft(1.0), checkpoint_config={"load_contents": ["model"]})
    with pytest.raises(ValueError, match=r"has keys this model does not: \['other.lora_A.weight'\]"):
        mgr.load_checkpoint(str(tmp_path))


def test_save_lora_only_of_a_peft_model_without_adapter_weights_is_refused(tmp_path):
    model = _Net(1.0)
    model.peft_config = {"default": None}  # claims PEFT, holds no lora_ weights
    mgr = FSDPCheckpointManager(model, checkpoint_config={"save_contents": ["model"], "save_lora_only": True})
    with pytest.raises(ValueError, match="none of its 1 state dict keys is a LoRA/adapter weight"):
        mgr.save_checkpoint(str(tmp_path))


def test_missing_parts_are_named(tmp_path):
    with pytest.raises(ValueError, match="'optimizer' but the manager was given no optimizer"):
        FSDPCheckpointManager(_Net(1.0)).save_checkpoint(str(tmp_path / "a"))
    FSDPCheckpointManager(_Net(1.0), checkpoint_config={"save_contents": ["model"]}).save_checkpoint(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"extra_state_world_size_1_rank_0.pt is missing"):
        FSDPCheckpointManager(_Net(1.0), checkpoint_config={"load_contents": ["extra"]}).load_checkpoint(str(tmp_path))


def test_rotation_keeps_the_newest_saved_folder(tmp_path):
    mgr = FSDPCheckpointManager(_Net(1.0), checkpoint_config={"save_contents": ["model"]})
    first, second = str(tmp_path / "global_step_1"), str(tmp_path / "global_step_2")
    mgr.save_checkpoint(first, max_ckpt_to_keep=1)
    mgr.save_checkpoint(second, max_ckpt_to_keep=1)
    assert not os.path.exists(first) and os.path.isdir(second) and mgr.previous_saved_paths == [second]
