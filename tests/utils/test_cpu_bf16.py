"""bf16 on a CPU without native bf16 is emulated (slower than fp32): the engines that would compute in it say so
at start-up, once per process. Whether this machine has native bf16 is faked both ways (it decides the warning,
and CI's CPU may differ from this one); the hf engine is real (the training engine's warning is asserted in
``tests/workers/engine/test_fsdp_engine.py``'s 2-rank run)."""

from __future__ import annotations

import logging

import pytest
import torch

from verl.utils import device
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout.hf_rollout import HFRollout


@pytest.fixture()
def fresh(monkeypatch):
    monkeypatch.setattr(device, "_bf16_warned", set())
    return monkeypatch


def test_this_cpu_reports_whether_it_has_native_bf16():
    assert device.cpu_has_native_bf16() is bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def test_bf16_on_an_emulating_cpu_is_named_once(fresh, caplog):
    fresh.setattr(device, "cpu_has_native_bf16", lambda: False)
    with caplog.at_level(logging.WARNING, logger="verl.utils.device"):
        assert device.warn_if_bf16_is_emulated(torch.bfloat16, "cpu", "the thing (some.key)")
        assert not device.warn_if_bf16_is_emulated(torch.bfloat16, "cpu", "the thing (some.key)")  # once
        assert not device.warn_if_bf16_is_emulated(torch.float32, "cpu", "fp32")
        assert not device.warn_if_bf16_is_emulated(torch.bfloat16, "cuda", "on a GPU")
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1 and "the thing (some.key) computes in bfloat16" in messages[0]
    assert "float32 is the faster choice" in messages[0]
    fresh.setattr(device, "cpu_has_native_bf16", lambda: True)
    assert not device.warn_if_bf16_is_emulated(torch.bfloat16, "cpu", "native")


@pytest.mark.parametrize("native", [False, True])
def test_the_hf_engine_warns_at_start_up_in_bf16(fresh, caplog, tiny_model_dir, native):
    fresh.setattr(device, "cpu_has_native_bf16", lambda: native)
    with caplog.at_level(logging.WARNING, logger="verl.utils.device"):
        HFRollout(RolloutConfig(dtype="bfloat16", response_length=4), tiny_model_dir)
        HFRollout(RolloutConfig(dtype="float32", response_length=4), tiny_model_dir)
    named = [r for r in caplog.records if "rollout.dtype" in r.getMessage()]
    assert len(named) == (0 if native else 1)
