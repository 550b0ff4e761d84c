"""The request API on the hf engine (tiny float32 Qwen2): continuous batching, per-sample determinism whatever
shares the batch, abort and resume, weight versions, and no stale KV after a weight load."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from verl.protocol import DataProto
from verl.utils.tiny_model import build_tiny_qwen2
from verl.workers.config.rollout import RolloutConfig
from verl.workers.rollout.hf_rollout import HFRollout

SAMPLED = {"temperature": 1.0, "top_k": 50, "top_p": 0.9, "ignore_eos": True}
GREEDY = {"temperature": 0.0, "ignore_eos": True}


def prompt(seed: int, length: int = 10) -> list[int]:
    return torch.randint(3, 256, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def wait_for(engine: HFRollout, request_id: str, tokens: int, timeout: float = 60) -> None:
    """Until the request in flight has generated ``tokens`` tokens."""
    deadline = time.monotonic() + timeout
    while (engine.progress(request_id) or 0) < tokens:
        assert engine.progress(request_id) is not None, f"{request_id} finished before {tokens} tokens"
        assert time.monotonic() < deadline, f"{request_id} made no progress"
        time.sleep(0.005)


async def wait_for_async(engine: HFRollout, request_id: str, tokens: int, timeout: float = 60) -> None:
    """:func:`wait_for` in a coroutine (the request's ``generate`` task submits it once the loop runs it)."""
    deadline = time.monotonic() + timeout
    while (engine.progress(request_id) or 0) < tokens:
        assert time.monotonic() < deadline, f"{request_id} did not reach {tokens} tokens in {timeout} s"
        await asyncio.sleep(0.005)


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> HFRollout:
    config = RolloutConfig(dtype="float32", prompt_length=48, response_length=256, max_num_seqs=8, seed=3)
    rollout = HFRollout(config, tiny_model_dir)
    yield rollout
    rollout.close()


def test_a_request_joins_a_running_one_and_finishes_first(engine):
    running = engine.submit("long", prompt(0), {**GREEDY, "max_tokens": 200})
    wait_for(engine, "long", 4)
    short = engine.submit("short", prompt(1), {**GREEDY, "max_tokens": 3})
    out = short.result(timeout=60)
    assert len(out.token_ids) == 3 and out.stop_reason == "completed"
    assert not running.done(), "the short request had to wait for the running one: no continuous batching"
    assert 3 < engine.progress("long") < 200
    assert len(running.result(timeout=60).token_ids) == 200


def test_samples_are_the_same_alone_together_and_mid_flight(engine):
    """Each sample draws from its own seeded stream: the batch it shares changes nothing but float rounding."""
    requests = [(f"s{i}", prompt(10 + i, 5 + 4 * i), {**SAMPLED, "seed": 100 + i, "max_tokens": 16}) for i in range(4)]
    alone = [engine.submit(f"alone-{r}", p, s).result(timeout=60) for r, p, s in requests]
    together = [f.result(timeout=60) for f in engine.submit_many([(f"all-{r}", p, s, None) for r, p, s in requests])]
    blocker = engine.submit("blocker", prompt(99, 30), {**GREEDY, "max_tokens": 60})
    wait_for(engine, "blocker", 3)
    first = engine.submit_many([(f"mid-{r}", p, s, None) for r, p, s in requests[:2]])
    wait_for(engine, "mid-s0", 5)
    second = engine.submit_many([(f"mid-{r}", p, s, None) for r, p, s in requests[2:]])
    mid = [f.result(timeout=60) for f in first + second]

    for outputs in (together, mid):
        for a, b in zip(alone, outputs, strict=True):
            assert a.token_ids == b.token_ids  # bit-exact tokens
            assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-5, rtol=0)
    assert len({tuple(a.token_ids) for a in alone}) == 4
    blocker.result(timeout=60)


def test_abort_returns_partial_tokens_and_resume_continues_as_if_uninterrupted(engine):
    params = {**SAMPLED, "seed": 5, "max_tokens": 80}

    async def scenario():
        whole = await engine.generate("whole", prompt_ids=prompt(2), sampling_params=params)
        task = asyncio.create_task(engine.generate("cut", prompt_ids=prompt(2), sampling_params=params))
        await wait_for_async(engine, "cut", 10)
        partial = engine.abort(["cut"])["cut"]
        returned = await task
        resumed = await engine.generate("cut", prompt_ids=prompt(2), sampling_params=params, resume_from=partial)
        return whole, partial, returned, resumed

    whole, partial, returned, resumed = asyncio.run(scenario())
    assert partial.stop_reason == "aborted" and partial.extra_fields["finish_reason"] == "abort"
    assert 10 <= len(partial.token_ids) < 80
    assert returned.token_ids == partial.token_ids, "the aborted generate call returns the same partial output"
    assert partial.token_ids == whole.token_ids[: len(partial.token_ids)]
    assert resumed.stop_reason == "completed" and resumed.token_ids == whole.token_ids
    assert torch.allclose(torch.tensor(resumed.log_probs), torch.tensor(whole.log_probs), atol=1e-5, rtol=0)
    assert set(resumed.weight_versions) == {engine.weight_version} and len(resumed.weight_versions) == 80
    assert engine.abort(["cut", "never-submitted"]) == {}


def test_cancelled_task_aborts_and_errors_name_the_request(engine):
    async def cancel():
        task = asyncio.create_task(engine.generate("doomed", prompt_ids=prompt(3), sampling_params=GREEDY))
        await wait_for_async(engine, "doomed", 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel())
    assert engine.progress("doomed") is None and engine.num_requests() == 0
    with pytest.raises(ValueError, match="'bad'.*unknown sampling_params \\['beam_width'\\]"):
        engine.submit("bad", prompt(4), {"beam_width": 4})
    with pytest.raises(ValueError, match="'long'.*305 tokens, more than the engine's context length 304"):
        engine.submit("long", prompt(4, 305), {})  # prompt_length 48 + response_length 256 = 304
    with pytest.raises(ValueError, match="repetition_penalty"):
        engine.submit("rep", prompt(4), {"repetition_penalty": 1.1})
    running = engine.submit("dup", prompt(4), {**GREEDY, "max_tokens": 100})
    with pytest.raises(ValueError, match="'dup'.*already in flight"):
        engine.submit("dup", prompt(4), GREEDY)
    with pytest.raises(RuntimeError, match="in flight"):
        engine.sleep()
    engine.abort(["dup"])
    assert running.result(timeout=60).stop_reason == "aborted"


def shared_prefix_prompts(prefix_len: int = 40, rows: int = 4) -> DataProto:
    """Prompts that share their first ``prefix_len`` tokens (what a prefix cache would reuse)."""
    prefix = torch.tensor(prompt(7, prefix_len))
    ids = torch.stack([torch.cat([prefix, torch.tensor(prompt(20 + i, 6))]) for i in range(rows)])
    mask = torch.ones_like(ids)
    return DataProto.from_dict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1},
        meta_info={"eos_token_id": 1, "global_steps": 1},
    )


def recompute(model: torch.nn.Module, out: DataProto) -> torch.Tensor:
    """The trainer's log-probs of the responses (one full-sequence forward)."""
    b = out.batch
    with torch.no_grad():
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"], position_ids=b["position_ids"])
    logits = logits.logits[:, b["prompts"].shape[1] - 1 : -1].float()
    lp = torch.log_softmax(logits, -1).gather(-1, b["responses"][..., None]).squeeze(-1)
    return lp * b["response_mask"]


def versions(batch) -> set[int]:
    """The weight versions that generated the batch's tokens (its samples' ``weight_version_ranges``)."""
    return {version for runs in batch.non_tensor_batch["weight_version_ranges"] for *_, version in runs}


def test_a_weight_load_preempts_running_requests_and_no_old_kv_is_used(tiny_model_dir):
    engine = HFRollout(RolloutConfig(dtype="float32", prompt_length=48, response_length=160), tiny_model_dir)
    old, new = build_tiny_qwen2(seed=0).eval(), build_tiny_qwen2(seed=1).eval()
    before = engine.generate_sequences(shared_prefix_prompts())
    assert versions(before) == {0}
    context = prompt(8, 12)
    running = engine.submit("across", context, {**GREEDY, "max_tokens": 150})
    wait_for(engine, "across", 10)
    engine.update_weights(new.state_dict().items())  # the trainer's sync, while the request decodes
    out = running.result(timeout=60)
    assert engine.weight_version == 1 and out.num_preempted == 1
    (s0, e0, v0), (s1, e1, v1) = out.weight_version_ranges()
    assert (s0, v0, e1, v1) == (0, 0, 150, 1) and e0 == s1 >= 10
    # tokens before the load come from the old weights, after it from the new ones on KV recomputed with them
    ids = torch.tensor([context + out.token_ids])
    for model, start, end in ((old, s0, e0), (new, s1, e1)):
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(context) - 1 : -1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[0, len(context) :, None]).squeeze(-1)
        assert torch.allclose(lp[start:end], torch.tensor(out.log_probs[start:end]), atol=1e-5, rtol=0)
    after = engine.generate_sequences(shared_prefix_prompts())
    assert versions(after) == {1}
    torch.testing.assert_close(after.batch["rollout_log_probs"], recompute(new, after), atol=1e-5, rtol=0)
    assert not torch.allclose(after.batch["rollout_log_probs"], recompute(old, after), atol=1e-2)
    engine.close()


def test_a_failing_step_fails_the_requests_in_flight_and_the_engine_serves_on(engine, monkeypatch):
    """Fault injection: the running batch's step raises once (as a model bug or an OOM would)."""
    step = engine._batch.step
    calls = {"n": 0}

    def broken_once():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected fault")
        return step()

    monkeypatch.setattr(engine._batch, "step", broken_once)
    futures = engine.submit_many([(f"f{i}", prompt(30 + i), {**GREEDY, "max_tokens": 20}, None) for i in range(2)])
    for i, future in enumerate(futures):
        with pytest.raises(RuntimeError, match=f"generate\\('f{i}'\\) failed in the engine step: injected fault"):
            future.result(timeout=60)
    assert engine.num_requests() == 0
    out = engine.submit("after", prompt(32), {**GREEDY, "max_tokens": 5}).result(timeout=60)
    assert len(out.token_ids) == 5


def test_prompt_logprobs_are_the_models_at_every_prompt_position_whatever_shares_the_batch(engine):
    """A distillation teacher's request (veRL's ``prompt_logprobs``, one token generated): each prompt token's
    log-prob (k = 0) or the top-k at each position, as one forward pass of the model over the prompt alone gives
    them — also when requests of other lengths are prefilled together (left padding) and one asks nothing."""
    prompts = [prompt(20, 12), prompt(21, 5), prompt(22, 9)]
    asks = [0, 3, None]
    futures = engine.submit_many(
        [
            (f"teacher{i}", p, {**GREEDY, "max_tokens": 1, **({} if k is None else {"prompt_logprobs": k})}, None)
            for i, (p, k) in enumerate(zip(prompts, asks, strict=True))
        ]
    )
    outs = [f.result(timeout=60) for f in futures]
    for p, k, out in zip(prompts, asks, outs, strict=True):
        if k is None:
            assert "prompt_logprobs" not in out.extra_fields
            continue
        with torch.no_grad():
            log_probs = torch.log_softmax(engine.model(torch.tensor([p])).logits[0].float(), -1)
        ids, values = out.extra_fields["prompt_ids"], out.extra_fields["prompt_logprobs"]
        assert len(ids) == len(values) == len(p) and values[0] == [0.0] * max(k, 1)  # nothing predicts token 0
        if k == 0:
            assert ids == [[t] for t in p]
            expected = log_probs[:-1].gather(-1, torch.tensor(p[1:])[:, None])
        else:
            top = log_probs[:-1].topk(k, -1)
            assert ids[1:] == top.indices.tolist()
            expected = top.values
        assert torch.allclose(torch.tensor(values[1:]), expected, atol=1e-5)
        assert len(out.token_ids) == 1
    with pytest.raises(ValueError, match=r"prompt_logprobs'\]=-1 must be an int >= 0"):
        engine.submit("bad", prompts[0], {"prompt_logprobs": -1})
