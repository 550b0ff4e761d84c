"""What the tests of the in-process server engines (vLLM, SGLang) share: the prompts, the trainer-side log-probs and
greedy continuation to compare against, and helpers of the request API tests. Not a test module."""

from __future__ import annotations

import time

import pytest
import torch

from verl.checkpoint_engine import ColocatedCheckpointEngine, WeightSyncError
from verl.protocol import DataProto
from verl.utils.tiny_model import build_tiny_qwen2
from verl.workers.rollout import get_rollout_class

PROMPT_LEN, RESPONSE_LEN = 6, 8


def start_engine(name: str, model_dir: str, max_model_len: int):
    """The engine ``name`` (float32, the model's own weights, seed 7) over ``model_dir``; starting it must not disturb
    the trainer's RNG stream nor its thread settings."""
    torch.manual_seed(1234)
    threads = torch.get_num_threads()
    before = torch.rand(3)
    torch.manual_seed(1234)
    rollout = get_rollout_class(name)(
        config={
            "name": name,
            "dtype": "float32",
            "tensor_model_parallel_size": 1,
            "prompt_length": PROMPT_LEN,
            "response_length": RESPONSE_LEN,
            "max_model_len": max_model_len,
            "load_format": "auto",
            "seed": 7,
        },
        model_path=model_dir,
    )
    assert torch.equal(torch.rand(3), before)
    assert torch.get_num_threads() == threads
    torch.set_num_threads(threads)  # and set_num_threads is a real function again
    return rollout


def load_model_back(engine, model_dir: str) -> None:
    """Sync the model on disk into ``engine`` (verified): after a test that loaded other weights into a shared engine,
    the tests that compare with the model pass in any order."""
    from transformers import AutoModelForCausalLM

    original = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ColocatedCheckpointEngine(dtype="float32").send_weights(original.state_dict().items(), engine, verify=True)


def prompts(step: int = 1, **meta) -> DataProto:
    """Three left-padded prompts (the third with 3 pads), ``n=2`` samples each unless ``meta`` says otherwise."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 256, (3, PROMPT_LEN), generator=g)
    mask = torch.ones_like(ids)
    mask[2, :3] = 0
    ids[2, :3] = 0
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        meta_info={"eos_token_id": 1, "pad_token_id": 0, "global_steps": step, "n": 2, **meta},
    )


def hf_log_probs(model, out: DataProto) -> torch.Tensor:
    """The trainer's view: ``model``'s log-probs of the generated tokens (masked)."""
    b = out.batch
    prompt_len = b["prompts"].shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits[:, prompt_len - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1) * b["response_mask"]


def assert_greedy_follows(engine, model, atol: float) -> None:
    """The engine's greedy responses are ``model``'s (up to EOS), and its log-probs within ``atol`` of the model's."""
    out = engine.generate_sequences(prompts(do_sample=False, n=1))
    b = prompts(n=1).batch
    expected = model.generate(
        input_ids=b["input_ids"],
        attention_mask=b["attention_mask"],
        do_sample=False,
        max_new_tokens=RESPONSE_LEN,
        eos_token_id=1,
        pad_token_id=0,
    )[:, PROMPT_LEN:]
    for row in range(3):
        length = int(out.batch["response_mask"][row].sum())
        assert out.batch["responses"][row, :length].tolist() == expected[row, :length].tolist(), row
    torch.testing.assert_close(out.batch["rollout_log_probs"], hf_log_probs(model, out), rtol=0, atol=atol)


def assert_verification_catches_a_corrupted_tensor(engine) -> None:
    """A sync whose engine-side load corrupts one tensor fails verification, naming the tensor."""
    weights = dict(build_tiny_qwen2(seed=12).state_dict())
    sync = ColocatedCheckpointEngine(dtype="float32")
    real = engine.update_weights

    def corrupting(named):
        real([(n, t + 1.0 if n.endswith("layers.0.self_attn.k_proj.weight") else t) for n, t in named])

    engine.update_weights = corrupting
    try:
        with pytest.raises(WeightSyncError, match=r"model.layers.0.self_attn.k_proj.weight"):
            sync.send_weights(weights.items(), engine, verify=True)
    finally:
        del engine.update_weights


def shared_prefix_prompts(prefix_len: int, suffix_len: int = 10) -> DataProto:
    """Four greedy prompts whose first ``prefix_len`` tokens agree (a prefix the engine's cache keeps)."""
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(3, 256, (1, prefix_len), generator=g).expand(4, -1)
    ids = torch.cat([prefix, torch.randint(3, 256, (4, suffix_len), generator=g)], dim=1)
    mask = torch.ones_like(ids)
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        meta_info={"eos_token_id": 1, "pad_token_id": 0, "do_sample": False, "n": 1},
    )


def perturbed(model, seed: int = 6, scale: float = 0.05):
    """``model`` with every weight moved by ``scale`` × Gaussian noise (in place); returns it."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.add_(scale * torch.randn(tensor.shape, generator=g))
    return model


def token_prompt(seed: int, length: int = PROMPT_LEN) -> list[int]:
    return torch.randint(3, 256, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def sampled(max_tokens: int, seed: int | None = None) -> dict:
    """Seeded sampling (greedy when ``seed`` is None), never stopping early."""
    if seed is None:
        return {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": True}
    return {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "seed": seed, "max_tokens": max_tokens, "ignore_eos": True}


def wait_for_tokens(engine, request_id: str, count: int, timeout: float = 60.0) -> None:
    """Until the request in flight has generated ``count`` tokens."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (engine.progress(request_id) or 0) >= count:
            return
        time.sleep(0.005)
    raise AssertionError(f"{request_id} did not reach {count} tokens in {timeout} s")
