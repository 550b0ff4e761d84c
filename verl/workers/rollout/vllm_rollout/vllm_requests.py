"""The vLLM engine's side of the request API: our requests as requests of vLLM v1's in-process ``LLMEngine``.

vLLM schedules them itself (continuous batching, its own KV blocks and prefix cache); this module admits requests
(``add_request`` of the context so far), maps each ``step()`` back to our requests (new tokens, their log-probs,
``"stop"`` / ``"length"``), aborts them, and resets the prefix cache.

Every admission gets a fresh engine-side id (``<request id>#<n>``): a request preempted by a weight load, or resumed
from an abort, is added again with its generated tokens appended to the prompt and ``max_tokens`` set to what is left.

Random streams. vLLM seeds a ``torch.Generator`` per request from ``SamplingParams.seed`` when the model runner
first sees the request, and the sampler draws from it once per sampled token: on CPU one ``randint(0, 2**31)`` (the
seed of the fused Gumbel-max kernel), elsewhere, and on CPU with fp64 Gumbel noise, one ``exponential_`` over a
vocabulary row. A re-added request would restart that stream, so :class:`StreamSeeker` wraps the model runner's
``_update_states`` (the point between creating a new request's generator and sampling its first token) and makes
the same draws again for the tokens the request already has: a resumed seeded request continues as if it had never
been interrupted. Only the CPU draw is verified by the tests; a sampler this module does not recognize (a vLLM
version or platform whose per-step draws differ) is logged once, and resumed requests there restart their stream.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

import torch

from verl.workers.rollout.request import prompt_logprob_rows
from verl.workers.rollout.serving import RequestState, SamplingSpec

__all__ = ["EngineRequests", "StreamSeeker", "vllm_sampling_params"]

logger = logging.getLogger(__name__)

Event = tuple[RequestState, list[int], list[float], str | None]


def vllm_sampling_params(spec: SamplingSpec, max_tokens: int, prompt_logprobs: int | None = None) -> Any:
    """Our :class:`SamplingSpec` as vLLM ``SamplingParams``: token ids in and out, one log-prob per sampled token,
    new tokens only in each output (``DELTA``); ``prompt_logprobs`` as vLLM's (None: not asked).

    Stopping is exactly ``spec.stop_token_ids`` (none with ``ignore_eos``), as in the hf engine: vLLM's own EOS
    handling is turned off (``ignore_eos=True``), since it would also stop at the model's EOS when the caller named
    other stop tokens.
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    greedy = spec.greedy
    return SamplingParams(
        n=1,
        max_tokens=max_tokens,
        temperature=0.0 if greedy else spec.temperature,
        top_p=1.0 if greedy else spec.top_p,
        top_k=spec.top_k if not greedy and spec.top_k > 0 else 0,
        seed=None if greedy else spec.seed,
        stop_token_ids=[] if spec.ignore_eos else list(spec.stop_token_ids),
        ignore_eos=True,
        repetition_penalty=spec.repetition_penalty,
        logprobs=0,
        prompt_logprobs=prompt_logprobs,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )


def prompt_logprob_fields(
    entries: list[Any], prompt_ids: list[int], k: int
) -> tuple[list[list[int]], list[list[float]]]:
    """vLLM's ``prompt_logprobs`` (one entry per context position: None for the first, else ``{token id:
    Logprob}`` holding the top-k and the position's own token) as our ``prompt_ids`` / ``prompt_logprobs`` fields
    (:func:`~verl.workers.rollout.request.prompt_logprob_rows`)."""
    return prompt_logprob_rows(
        prompt_ids,
        k,
        own=lambda position: entries[position][prompt_ids[position]].logprob,
        candidates=lambda position: ((token, lp.logprob) for token, lp in entries[position].items()),
    )


def _draw_function(runner: Any) -> Callable[[torch.Generator, int], None] | None:
    """``draw(generator, k)``: the draws vLLM's sampler makes from a request's generator for ``k`` sampled tokens,
    or None for a sampler whose draws this module does not know."""
    sampler = getattr(getattr(runner, "sampler", None), "topk_topp_sampler", None)
    forward = getattr(getattr(sampler, "forward", None), "__func__", None)
    name = getattr(forward, "__name__", None)
    fp64 = bool(getattr(sampler, "use_fp64_gumbel", False))
    if name == "forward_cpu" and not fp64:

        def draw(generator: torch.Generator, k: int) -> None:
            for _ in range(k):  # forward_cpu: one int64 seed of the fused Gumbel-max kernel per token
                torch.randint(0, 2**31, (1,), generator=generator, dtype=torch.long)

        return draw
    if name in ("forward_native", "forward_cuda", "forward_hip", "forward_cpu"):
        # random_sample (forward_cuda and forward_hip fall back to it when per-request generators exist):
        # one exponential_ over the request's row of vocabulary-wide noise per token
        vocab = runner.model_config.get_vocab_size()
        dtype = torch.float64 if fp64 else torch.float32
        device = runner.device

        def draw(generator: torch.Generator, k: int) -> None:
            noise = torch.empty(vocab, dtype=dtype, device=device)
            for _ in range(k):
                noise.exponential_(generator=generator)

        return draw
    return None


class StreamSeeker:
    """Advances the generator of a re-added seeded request past the draws of the tokens it already has.

    Installed on the in-process model runner by wrapping its ``_update_states``: after the runner created the
    generators of the step's new requests, and before the step samples, each new request registered with
    :meth:`skip` gets its generator advanced by that many tokens' draws.
    """

    def __init__(self, runner: Any) -> None:
        self._pending: dict[str, int] = {}
        self._draw = _draw_function(runner)
        original = getattr(runner, "_update_states", None)
        if self._draw is None or original is None or not isinstance(getattr(runner, "requests", None), dict):
            name = type(getattr(getattr(runner, "sampler", None), "topk_topp_sampler", None)).__name__
            logger.warning(
                "vLLMRollout: this vLLM's sampler (%s) or model runner (%s) is not one whose random draws are "
                "known; a resumed seeded request restarts its random stream instead of continuing it",
                name,
                type(runner).__name__,
            )
            self.enabled = False
            return
        self.enabled = True

        def update_states(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(scheduler_output, *args, **kwargs)
            if self._pending:
                for new in scheduler_output.scheduled_new_reqs:
                    k = self._pending.pop(new.req_id, 0)
                    state = runner.requests.get(new.req_id)
                    if k and state is not None and state.generator is not None:
                        self._draw(state.generator, k)
            return result

        runner._update_states = update_states

    def skip(self, internal_id: str, k: int) -> None:
        """When vLLM's request ``internal_id`` is first scheduled, advance its generator by ``k`` tokens' draws."""
        if self.enabled and k > 0:
            self._pending[internal_id] = k

    def forget(self, internal_id: str) -> None:
        self._pending.pop(internal_id, None)


class EngineRequests:
    """Our running requests as requests of one in-process vLLM ``LLMEngine``.

    Args:
        llm_engine: ``vllm.LLM(...).llm_engine`` (vLLM v1, in-process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
        runner: the model runner that executes it (for :class:`StreamSeeker`), or None to restart streams.
    """

    def __init__(self, llm_engine: Any, runner: Any | None) -> None:
        self.engine = llm_engine
        self.seeker = StreamSeeker(runner) if runner is not None else None
        self._requests: dict[str, RequestState] = {}  # engine id -> request
        self._engine_ids: dict[str, str] = {}  # request id -> engine id
        self._internal_ids: dict[str, str] = {}  # engine id -> vLLM's internal id
        self._counter = itertools.count()
        self.lora_request: Any = None  # a vLLM LoRARequest every added request carries (the engine's adapter)

    def __len__(self) -> int:
        return len(self._requests)

    def add(self, requests: list[RequestState]) -> None:
        """Start ``requests``: prefill of the prompt plus the tokens generated so far, ``max_tokens`` what is left."""
        from vllm.inputs import TokensPrompt

        added: list[RequestState] = []
        try:
            for request in requests:
                engine_id = f"{request.request_id}#{next(self._counter)}"
                asked = request.spec.prompt_logprobs if request.prompt_logprobs is None else None
                params = vllm_sampling_params(request.spec, request.remaining, asked)
                self._requests[engine_id] = request
                self._engine_ids[request.request_id] = engine_id
                added.append(request)
                # vLLM names the request internally (engine id + a random suffix); the model runner sees that name
                internal_id = self.engine.add_request(
                    engine_id,
                    TokensPrompt(prompt_token_ids=request.context_ids),
                    params,
                    lora_request=self.lora_request,
                )
                self._internal_ids[engine_id] = internal_id
                if self.seeker is not None and params.seed is not None:
                    self.seeker.skip(internal_id, len(request.token_ids))
        except BaseException:
            self.release(added)  # none of this admission stays behind in vLLM
            raise

    def step(self) -> list[Event]:
        """One ``LLMEngine.step()``: the new tokens of each request that advanced; finished ones are forgotten."""
        events: list[Event] = []
        for output in self.engine.step():
            request = self._requests.get(output.request_id)
            if request is None:  # released in the meantime
                continue
            completion = output.outputs[0]
            if request.spec.prompt_logprobs is not None and request.prompt_logprobs is None and output.prompt_logprobs:
                request.prompt_logprobs = prompt_logprob_fields(
                    output.prompt_logprobs, request.prompt_ids, request.spec.prompt_logprobs
                )
            tokens = [int(t) for t in completion.token_ids]
            entries = completion.logprobs or []
            log_probs = [float(entry[t].logprob) for entry, t in zip(entries, tokens, strict=True)]
            finish = None
            if output.finished:
                if completion.finish_reason not in ("stop", "length"):
                    raise RuntimeError(
                        f"vLLM ended request {output.request_id!r} with finish_reason={completion.finish_reason!r}"
                    )
                self._forget(output.request_id)
                spec = request.spec
                last = tokens[-1] if tokens else request.token_ids[-1] if request.token_ids else None
                finish = "stop" if not spec.ignore_eos and last in spec.stop_token_ids else "length"
            if tokens or finish is not None:
                events.append((request, tokens, log_probs, finish))
        return events

    def release(self, requests: list[RequestState]) -> None:
        """Abort ``requests`` in vLLM (their KV blocks are freed at once)."""
        engine_ids = [e for e in (self._engine_ids.get(r.request_id) for r in requests) if e is not None]
        for engine_id in engine_ids:
            self._forget(engine_id)
        if engine_ids:
            self.engine.abort_request(engine_ids)

    def reset_prefix_cache(self) -> None:
        """Drop vLLM's prefix cache. vLLM refuses while requests hold KV blocks, so its running requests are
        preempted first (``reset_running_requests``; the caller releases them right after); a failed reset raises."""
        if not self.engine.reset_prefix_cache(reset_running_requests=True):
            raise RuntimeError("vLLMRollout: vLLM did not reset its prefix cache after a weight load")

    def _forget(self, engine_id: str) -> None:
        request = self._requests.pop(engine_id, None)
        if request is not None and self._engine_ids.get(request.request_id) == engine_id:
            del self._engine_ids[request.request_id]
        internal_id = self._internal_ids.pop(engine_id, None)
        if self.seeker is not None and internal_id is not None:
            self.seeker.forget(internal_id)
