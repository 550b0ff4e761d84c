"""The hf engine's lean LoRA linears against peft on the same adapters (tiny Qwen2, float32, one process)."""

from __future__ import annotations

import pytest
import torch

from verl.utils.tiny_model import build_tiny_qwen2
from verl.workers.config.lora import LoraSpec
from verl.workers.engine.lora import apply_lora, sync_name
from verl.workers.rollout.hf_lora import LoraLinear, attach_lora


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "down_proj"]])
def test_lean_lora_linears_give_peft_logits_under_the_same_names(targets):
    spec = LoraSpec(rank=4, alpha=8, target_modules=targets)
    trained = apply_lora(build_tiny_qwen2(seed=0), spec)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    pushed = {sync_name(k): v for k, v in trained.state_dict().items() if sync_name(k) is not None}

    engine = build_tiny_qwen2(seed=0).eval()
    named = attach_lora(engine, spec)
    assert set(named) == set(pushed)  # the names a push carries are exactly the engine's
    assert sum(isinstance(m, LoraLinear) for m in engine.modules()) == len([n for n in pushed if "lora_A" in n])
    with torch.no_grad():
        for name, value in pushed.items():
            named[name].copy_(value)
        ids = torch.randint(3, 200, (2, 9), generator=gen)
        expected = trained.eval()(input_ids=ids).logits
        got = engine(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert not torch.allclose(expected, build_tiny_qwen2(seed=0).eval()(input_ids=ids).logits, atol=1e-3)
