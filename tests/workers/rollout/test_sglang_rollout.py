"""The SGLang engine in process (sglang 0.5.23 on CPU, with the import-only stand-ins of tests/sglang_cpu for its
CUDA kernel package and torchvision), against a plain HF model: the rollout contract, log-probs against the trainer's
after a sync (also with a shared prefix in SGLang's radix cache), digest-verified weight sync, continuous batching,
abort and resume, weight versions across a push. One engine serves every test. Runs in the sglang venv (marker
``sglang``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("sglang", reason="the sglang-marked tests run in the sglang venv built by scripts/test.sh")
pytestmark = pytest.mark.sglang

from transformers import AutoModelForCausalLM  # noqa: E402

from tests.workers.rollout.engine_checks import (  # noqa: E402
    PROMPT_LEN,
    RESPONSE_LEN,
    assert_greedy_follows,
    assert_verification_catches_a_corrupted_tensor,
    hf_log_probs,
    load_model_back,
    perturbed,
    prompts,
    sampled,
    shared_prefix_prompts,
    start_engine,
    token_prompt,
    wait_for_tokens,
)
from verl.checkpoint_engine import ColocatedCheckpointEngine  # noqa: E402
from verl.utils.tiny_model import build_tiny_qwen2, save_tiny_qwen2  # noqa: E402
from verl.workers.rollout import get_rollout_class  # noqa: E402

MAX_MODEL_LEN = 256
# measured on CPU in float32: SGLang's torch_native attention against HF's eager forward, 1e-6 at most
LOG_PROB_ATOL = 2e-5


EOS_PROMPT_SEED = 9


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny model with its EOS id set to the third token of its greedy continuation of the EOS prompt: SGLang
    also stops at a model's EOS, which the engine must undo where a request names other stop tokens."""
    model = build_tiny_qwen2(seed=0)
    with torch.no_grad():
        ids = model.generate(torch.tensor([token_prompt(EOS_PROMPT_SEED)]), do_sample=False, max_new_tokens=3)
    return save_tiny_qwen2(tmp_path_factory.mktemp("sglang") / "tiny", seed=0, eos_token_id=int(ids[0, -1]))


@pytest.fixture(scope="module")
def engine(model_dir):
    rollout = start_engine("sglang", model_dir, MAX_MODEL_LEN)
    yield rollout
    rollout.close()


@pytest.fixture
def restore_weights(engine, model_dir):
    """For a test that loads other weights into the shared engine: the model on disk is loaded back afterwards."""
    yield
    load_model_back(engine, model_dir)


def test_generation_contract_and_log_probs(engine, model_dir):
    out = engine.generate_sequences(prompts())
    b = out.batch
    assert b["responses"].shape == (6, RESPONSE_LEN) and b["input_ids"].shape == (6, PROMPT_LEN + RESPONSE_LEN)
    assert torch.equal(b["attention_mask"][:, PROMPT_LEN:], b["response_mask"])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.testing.assert_close(b["rollout_log_probs"], hf_log_probs(model, out), rtol=0, atol=LOG_PROB_ATOL)
    assert not torch.equal(b["responses"][0], b["responses"][1])  # two samples of one prompt


def test_a_verified_sync_then_greedy_and_log_probs_follow_the_trainer(engine, restore_weights):
    trained = build_tiny_qwen2(seed=11)
    sync = ColocatedCheckpointEngine(bucket_megabytes=0.2, dtype="float32")
    stats = sync.send_weights(trained.state_dict().items(), engine, verify=True)  # bucketed, verified bit for bit
    assert stats["buckets"] > 1
    assert_greedy_follows(engine, trained, atol=LOG_PROB_ATOL)


def test_verification_catches_a_corrupted_tensor(engine, restore_weights):
    assert_verification_catches_a_corrupted_tensor(engine)


def test_log_probs_after_a_sync_with_a_shared_prefix_in_the_cache(engine, model_dir, restore_weights):
    """The prefix cached under the old weights is not reused after the push. With ``_serve_invalidate`` a no-op this
    fails: all 32 log-probs off, by up to 2.6 (measured)."""
    batch = shared_prefix_prompts(40, 6)
    engine.generate_sequences(batch)  # caches the shared prefix under the current weights
    model = perturbed(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    engine.update_weights(model.state_dict().items())
    out = engine.generate_sequences(batch)
    torch.testing.assert_close(out.batch["rollout_log_probs"], hf_log_probs(model, out), rtol=0, atol=1e-4)


def test_cpu_sleep_is_a_documented_no_op_and_tp_and_lora_are_checked(engine, model_dir):
    assert engine.supports_sleep is False
    weights = sum(t.numel() * t.element_size() for _, t in engine.named_weights())
    held = engine.memory_bytes()
    assert held > weights  # the weights and a KV pool (max_total_tokens)
    engine.sleep()
    assert engine.memory_bytes() == held  # nothing is released on CPU
    engine.wake_up(["weights"])
    assert engine.generate_sequences(prompts()).batch["responses"].shape == (6, RESPONSE_LEN)
    cls = get_rollout_class("sglang")
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2"):
        cls(config={"name": "sglang", "tensor_model_parallel_size": 2}, model_path=model_dir)
    with pytest.raises(NotImplementedError, match="LoRA"):
        cls(config={"name": "sglang", "tensor_model_parallel_size": 1}, model_path=model_dir, lora=object())
    deterministic = {"sglang": {"enable_deterministic_inference": True}}
    config = {"name": "sglang", "tensor_model_parallel_size": 1, "engine_kwargs": deterministic}
    with pytest.raises(ValueError, match="engine_kwargs.sglang.enable_deterministic_inference: not available on CPU"):
        cls(config=config, model_path=model_dir)


# ---------------------------------------------------------------------------------------------- the request API
def test_stopping_is_exactly_the_requests_stop_tokens(engine):
    (eos,) = engine._default_eos  # the model's EOS
    prompt = token_prompt(EOS_PROMPT_SEED)
    free = engine.submit("free", prompt, sampled(12)).result(timeout=60)  # ignore_eos: no stop at all
    assert eos in free.token_ids and len(free.token_ids) == 12 and 1 not in free.token_ids
    first = free.token_ids.index(eos)
    own = engine.submit("model-eos", prompt, {"temperature": 0.0, "max_tokens": 12}).result(timeout=60)
    assert own.token_ids == free.token_ids[: first + 1] and own.extra_fields["finish_reason"] == "stop"
    # stop at token 1 only: SGLang stops at the model's EOS as well, and the engine continues the request past it
    other = engine.submit("other-stop", prompt, {"temperature": 0.0, "max_tokens": 12, "stop_token_ids": [1]})
    other = other.result(timeout=60)
    assert other.token_ids == free.token_ids and other.extra_fields["finish_reason"] == "length"
    torch.testing.assert_close(torch.tensor(other.log_probs), torch.tensor(free.log_probs), rtol=0, atol=1e-5)


def test_a_request_fills_the_whole_context(engine):
    """Prompt and response up to ``max_model_len`` tokens, never cut short by SGLang's own length limit."""
    prompt = token_prompt(6, 32)
    out = engine.submit("full", prompt, sampled(MAX_MODEL_LEN - 32)).result(timeout=120)
    assert len(out.token_ids) == MAX_MODEL_LEN - 32 and out.extra_fields["finish_reason"] == "length"


def test_a_short_request_overtakes_a_running_long_one(engine):
    long = engine.submit("long", token_prompt(1), sampled(120))
    wait_for_tokens(engine, "long", 3)
    with pytest.raises(RuntimeError, match="in flight"):
        engine.sleep()
    short = engine.submit("short", token_prompt(2), sampled(4)).result(timeout=60)
    assert len(short.token_ids) == 4 and short.stop_reason == "completed"
    assert not long.done()  # the short one joined SGLang's running batch and left it first
    out = long.result(timeout=60)
    assert len(out.token_ids) == 120 and out.extra_fields["finish_reason"] == "length"


def test_abort_returns_partial_tokens_and_resume_completes_the_response(engine):
    prompt, params = token_prompt(3), sampled(60)
    reference = engine.submit("uninterrupted", prompt, params).result(timeout=60)
    future = engine.submit("resumable", prompt, params)
    wait_for_tokens(engine, "resumable", 5)
    partial = engine.abort(["resumable"])["resumable"]
    assert future.result(timeout=10) == partial  # the pending caller gets the same partial output
    assert partial.stop_reason == "aborted" and partial.extra_fields["finish_reason"] == "abort"
    assert 5 <= len(partial.token_ids) < 60 and len(partial.log_probs) == len(partial.token_ids)
    assert engine.abort(["resumable"]) == {}  # no longer in flight
    resumed = engine.submit("resumable", prompt, params, resume_from=partial).result(timeout=60)
    # greedy: the resumed response is the uninterrupted one (SGLang recomputes the prefix's KV)
    assert resumed.token_ids == reference.token_ids
    torch.testing.assert_close(torch.tensor(resumed.log_probs), torch.tensor(reference.log_probs), rtol=0, atol=1e-5)


def test_a_weight_load_preempts_the_running_request_and_versions_its_tokens(engine, model_dir):
    original = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    prompt, params = token_prompt(4), sampled(100)
    reference = engine.submit("unpreempted", prompt, params).result(timeout=60)
    version = engine.weight_version
    future = engine.submit("across-update", prompt, params)
    wait_for_tokens(engine, "across-update", 5)
    engine.update_weights(original.items())  # the same weights: the recomputed KV gives the same tokens
    out = future.result(timeout=60)
    assert engine.weight_version == version + 1
    assert out.num_preempted == 1
    (start, split, old), (split_again, end, new) = out.weight_version_ranges()
    assert (start, old, new, end) == (0, version, version + 1, 100) and split == split_again >= 5
    assert out.token_ids == reference.token_ids


def test_prompt_logprobs_are_the_models_at_every_prompt_position(engine, model_dir):
    """A distillation teacher's request (``prompt_logprobs``: 0 for each prompt token's own log-prob, k for the top-k
    at each position), against the HF model's forward pass over the prompt alone."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompt = token_prompt(5, 11)
    with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([prompt])).logits[0, :-1].float(), -1)
    futures = engine.submit_many(
        [(f"teacher{k}", prompt, {"temperature": 0.0, "max_tokens": 1, "prompt_logprobs": k}, None) for k in (0, 3)]
    )
    own, top = (f.result(timeout=120).extra_fields for f in futures)
    assert own["prompt_ids"] == [[t] for t in prompt] and own["prompt_logprobs"][0] == [0.0]
    expected = log_probs.gather(-1, torch.tensor(prompt[1:])[:, None])
    torch.testing.assert_close(torch.tensor(own["prompt_logprobs"][1:]), expected, rtol=0, atol=LOG_PROB_ATOL)
    best = log_probs.topk(3, -1)
    assert top["prompt_ids"][1:] == best.indices.tolist()
    torch.testing.assert_close(torch.tensor(top["prompt_logprobs"][1:]), best.values, rtol=0, atol=LOG_PROB_ATOL)
