"""The SGLang engine's side of the request API: our requests as streaming requests of an in-process ``sglang.Engine``.

SGLang schedules them itself (its scheduler process runs continuous batching, its radix prefix cache and KV pool);
this module starts each request as a streaming ``generate_request`` of the engine's tokenizer manager on the
engine's event loop (a thread of its own, :class:`EngineLoop`), turns every streamed chunk into new tokens, their
log-probs and the finish reason, and queues them for the engine thread of :mod:`verl.workers.rollout.serving`,
whose ``_serve_step`` collects them. Releasing a request (abort, preemption by a weight load) aborts it in SGLang
and drops whatever it streamed after the last collected step: those tokens were never delivered, so a re-admitted
request regenerates them from its context.

Every admission gets a fresh engine-side id (a uuid hex: SGLang aborts by id prefix, so no id may be the prefix of
another); a request preempted or resumed is started again with its generated tokens appended to the prompt and
``max_new_tokens`` set to what is left.

Random streams. SGLang samples seeded requests (``sampling_seed``) only with ``enable_deterministic_inference``, and
then from a hash of (seed, position), so a resumed seeded request draws what an uninterrupted one would. Without it
(the default here) a request's samples come from the scheduler's global generator: they depend on what runs
beside them, and a resumed request does not continue a stream of its own.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import Coroutine
from typing import Any

from verl.workers.rollout.request import prompt_logprob_rows
from verl.workers.rollout.serving import RequestState, SamplingSpec

__all__ = ["EngineLoop", "SGLangRequests", "sglang_sampling_params"]

logger = logging.getLogger(__name__)

Event = tuple[RequestState, list[int], list[float], str | None]

# How long one engine-thread step waits for SGLang to stream something before letting other callers in.
_STEP_WAIT_S = 0.05


def sglang_sampling_params(spec: SamplingSpec, max_tokens: int, deterministic: bool) -> dict[str, Any]:
    """Our :class:`SamplingSpec` as SGLang's sampling-params dict.

    SGLang stops at ``stop_token_ids`` and also at the model's own EOS ids (``ignore_eos`` turns both off); a stop
    the caller did not ask for is undone by :class:`SGLangRequests`, which continues the request.
    """
    greedy = spec.greedy
    params: dict[str, Any] = {
        "max_new_tokens": max_tokens,
        "temperature": 0.0 if greedy else spec.temperature,
        "top_p": 1.0 if greedy else spec.top_p,
        "top_k": spec.top_k if not greedy and spec.top_k > 0 else -1,
        "repetition_penalty": spec.repetition_penalty,
        "stop_token_ids": [] if spec.ignore_eos else list(spec.stop_token_ids),
        "ignore_eos": spec.ignore_eos,
        "no_stop_trim": True,
        "skip_special_tokens": False,
    }
    if deterministic and not greedy and spec.seed is not None:
        params["sampling_seed"] = int(spec.seed) % 2**63
    return params


class EngineLoop:
    """An asyncio event loop on a daemon thread: the one loop every call into SGLang's tokenizer manager runs on
    (its handle loop binds to the loop of the first request)."""

    def __init__(self, name: str = "sglang-io") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Any, *args: Any) -> None:
        """Call ``fn(*args)`` on the loop's thread (no waiting)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)


def prompt_logprob_fields(
    meta: dict[str, Any], prompt_ids: list[int], k: int
) -> tuple[list[list[int]], list[list[float]]]:
    """SGLang's ``input_token_logprobs`` / ``input_top_logprobs`` (one ``(log-prob, token, text)`` entry, or a list of
    them, per prompt position; the first without a value) as our ``prompt_ids`` / ``prompt_logprobs`` fields
    (:func:`~verl.workers.rollout.request.prompt_logprob_rows`)."""
    own, top = meta.get("input_token_logprobs") or [], meta.get("input_top_logprobs") or []
    return prompt_logprob_rows(
        prompt_ids,
        k,
        own=lambda position: own[position][0],
        candidates=lambda position: ((entry[1], entry[0]) for entry in top[position]),
    )


class SGLangRequests:
    """Our running requests as streaming requests of one in-process ``sglang.Engine``.

    Args:
        engine: the ``sglang.Engine``.
        loop: the :class:`EngineLoop` its tokenizer manager runs on.
        deterministic: the engine runs with ``enable_deterministic_inference`` (seeded requests get their seed).
    """

    def __init__(self, engine: Any, loop: EngineLoop, deterministic: bool) -> None:
        self.engine = engine
        self.loop = loop
        self.deterministic = deterministic
        self._events: queue.Queue[tuple[str, list[int], list[float], str | None, Any]] = queue.Queue()
        self._requests: dict[str, RequestState] = {}  # engine id -> request
        self._engine_ids: dict[str, str] = {}  # request id -> engine id

    def add(self, requests: list[RequestState]) -> None:
        """Start ``requests``: prefill of the prompt plus the tokens generated so far, ``max_new_tokens`` what is
        left."""
        for request in requests:
            self._start(request, [])

    def _start(self, request: RequestState, pending: list[int]) -> None:
        """Start ``request`` with ``pending`` (tokens it generated that the engine thread has not delivered yet)
        appended to its context."""
        from sglang.srt.managers.io_struct import GenerateReqInput

        engine_id = uuid.uuid4().hex
        self._requests[engine_id] = request
        self._engine_ids[request.request_id] = engine_id
        asked = request.spec.prompt_logprobs if request.prompt_logprobs is None else None
        obj = GenerateReqInput(
            input_ids=request.context_ids + pending,
            sampling_params=sglang_sampling_params(request.spec, request.remaining - len(pending), self.deterministic),
            return_logprob=True,
            logprob_start_len=0 if asked is not None else -1,
            top_logprobs_num=asked or 0,
            stream=True,
            rid=engine_id,
        )
        asyncio.run_coroutine_threadsafe(self._stream(engine_id, obj), self.loop.loop)

    async def _stream(self, engine_id: str, obj: Any) -> None:
        seen = 0
        try:
            async for chunk in self.engine.tokenizer_manager.generate_request(obj, None):
                meta = chunk["meta_info"]
                entries = meta.get("output_token_logprobs") or []
                new = entries[seen:]
                seen = len(entries)
                finish = meta.get("finish_reason")
                reason = finish.get("type") if isinstance(finish, dict) else finish
                if new or reason is not None:
                    self._events.put((engine_id, [int(e[1]) for e in new], [float(e[0]) for e in new], reason, meta))
        except BaseException as error:  # the engine thread raises it for the request
            self._events.put((engine_id, [], [], "error", error))

    def step(self) -> list[Event]:
        """What SGLang streamed since the last step (waiting up to ``_STEP_WAIT_S`` for the first of it): new
        tokens per request; finished requests are forgotten."""
        events: dict[str, Event] = {}
        try:
            items = [self._events.get(timeout=_STEP_WAIT_S)]
        except queue.Empty:
            return []
        while True:
            try:
                items.append(self._events.get_nowait())
            except queue.Empty:
                break
        for engine_id, tokens, log_probs, reason, meta in items:
            request = self._requests.get(engine_id)
            if request is None:  # released in the meantime: what it streamed since is dropped
                continue
            if reason == "error":
                raise RuntimeError(f"SGLang failed request {request.request_id!r}: {meta!r}") from meta
            if request.spec.prompt_logprobs is not None and request.prompt_logprobs is None:
                if meta.get("input_token_logprobs"):
                    request.prompt_logprobs = prompt_logprob_fields(
                        meta, request.prompt_ids, request.spec.prompt_logprobs
                    )
            previous = events.get(engine_id)
            if previous is not None:
                tokens = previous[1] + tokens
                log_probs = previous[2] + log_probs
            finish = None
            if reason is not None:
                if reason not in ("stop", "length"):
                    raise RuntimeError(f"SGLang ended request {request.request_id!r} with finish_reason={reason!r}")
                self._forget(engine_id)
                spec = request.spec
                done = request.token_ids + tokens
                last = done[-1] if done else None
                finish = "stop" if not spec.ignore_eos and last in spec.stop_token_ids else "length"
                if finish == "length" and len(done) < spec.max_tokens:
                    if reason != "stop":  # never silently short: SGLang's own length limit cut the request
                        raise RuntimeError(
                            f"SGLang ended request {request.request_id!r} after {len(done)} of {spec.max_tokens} "
                            "tokens (its context_length or max_total_tokens is too small for the request)"
                        )
                    self._start(request, tokens)  # SGLang stopped at the model's EOS, which was not asked for
                    finish = None
            events[engine_id] = (request, tokens, log_probs, finish)
        return list(events.values())

    def release(self, requests: list[RequestState]) -> None:
        """Abort ``requests`` in SGLang; what they streamed since the last step is dropped."""
        for request in requests:
            engine_id = self._engine_ids.get(request.request_id)
            if engine_id is not None and self._requests.get(engine_id) is request:
                self._forget(engine_id)
                self.loop.call(self.engine.tokenizer_manager.abort_request, engine_id)

    def release_all(self) -> None:
        """Abort every request this engine runs (a weight load begins)."""
        self.release(list(self._requests.values()))

    def _forget(self, engine_id: str) -> None:
        request = self._requests.pop(engine_id, None)
        if request is not None and self._engine_ids.get(request.request_id) == engine_id:
            del self._engine_ids[request.request_id]
