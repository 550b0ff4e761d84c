"""The request API every rollout engine serves: ``async generate(request_id, *, prompt_ids, sampling_params)``.

One engine thread per engine owns the model. Callers (any thread, any event loop) submit requests; the thread
admits them into the running batch between decode steps as slots free (``rollout.max_num_seqs``), steps all running
requests together, and resolves each request's future when it finishes: continuous batching. ``abort`` takes
requests out between steps and returns what they generated so far; ``generate(..., resume_from=partial)``
continues a request from its partial tokens.

Weights are versioned. Every weight load (``update_weights``, or a whole sync inside :meth:`weight_update`) bumps
the version, drops the engine's prefix caches, and preempts the running requests: their KV is recomputed under the
new weights before they continue (``num_preempted`` counts it), so no cached KV of older weights is ever used. Each
token records the version that produced it (``TokenOutput.weight_versions``).

Engines implement four hooks, all called by the engine thread (or under the engine lock):
``_serve_admit(requests)`` starts requests (prefill of ``context_ids``), ``_serve_step()`` decodes one token for the
running ones and returns ``(request, new_tokens, new_log_probs, finish_reason | None)`` per request that advanced
(finished requests are released by the engine itself), ``_serve_release(requests)`` drops running requests
(aborted or preempted), and ``_serve_invalidate()`` drops prefix caches after a weight load.

The batch ``generate_sequences`` is a thin layer over the same path: one request per sample, submitted together,
gathered, assembled into the rollout contract's batch.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from verl.protocol import DataProto
from verl.workers.rollout.replica import TokenOutput
from verl.workers.rollout.request import as_token_ids, gather_output, plan_generation, plan_requests, sample_seed

__all__ = ["RequestServing", "RequestState", "SamplingSpec", "resolve_sampling_params"]

logger = logging.getLogger(__name__)

# Waking from idle, the engine thread waits for more arrivals while they come at most this far apart, for at most
# the window: a burst of concurrent submissions then starts as one batch (one prefill) instead of a trickle.
_ARRIVAL_GAP_S = 0.001
_ARRIVAL_WINDOW_S = 0.01

_SAMPLING_KEYS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "max_tokens",
        "max_new_tokens",
        "seed",
        "stop_token_ids",
        "ignore_eos",
        "logprobs",
        "prompt_logprobs",
        "repetition_penalty",
        "detokenize",
        "n",
    }
)


@dataclass(frozen=True)
class SamplingSpec:
    """One request's sampling, settled: temperature 0 is greedy; ``stop_token_ids`` end a response (kept)."""

    temperature: float
    top_p: float
    top_k: int
    max_tokens: int
    seed: int | None
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    logprobs: bool
    repetition_penalty: float = 1.0
    prompt_logprobs: int | None = None  # None: not asked; 0: each prompt token's own; k: the top-k at each position

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _request_seed(base_seed: int, request_id: str) -> int:
    """A stable per-request seed for requests that bring none (the same request id samples the same tokens)."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8, person=b"verl-request").digest()
    return sample_seed(base_seed, 0, int.from_bytes(digest, "little") >> 1, 0)


def resolve_sampling_params(
    request_id: str,
    prompt_len: int,
    sampling_params: Mapping[str, Any] | None,
    config: Any,
    default_eos: list[int],
    max_model_len: int,
) -> SamplingSpec:
    """veRL's ``sampling_params`` dict → :class:`SamplingSpec`, with veRL's ``max_tokens`` default:
    ``min(response_length, prompt_length + response_length - len(prompt_ids))``, capped by the context left."""
    params = dict(sampling_params or {})
    unknown = sorted(set(params) - _SAMPLING_KEYS)
    if unknown:
        raise ValueError(
            f"generate({request_id!r}): unknown sampling_params {unknown}; known: {sorted(_SAMPLING_KEYS)}"
        )
    if params.get("n", 1) != 1:
        raise ValueError(f"generate({request_id!r}): sampling_params['n'] must be 1 (one request per sample)")
    room = max_model_len - prompt_len
    if room < 0:
        raise ValueError(
            f"generate({request_id!r}): the prompt has {prompt_len} tokens, more than the engine's context length "
            f"{max_model_len} (rollout.max_model_len)"
        )
    max_tokens = params.get("max_tokens", params.get("max_new_tokens"))
    if max_tokens is None:
        max_tokens = min(config.response_length, config.prompt_length + config.response_length - prompt_len)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise ValueError(f"generate({request_id!r}): sampling_params['max_tokens']={max_tokens!r} must be an int")
    temperature = float(params.get("temperature", config.temperature))
    top_p = float(params.get("top_p", config.top_p))
    top_k = int(params.get("top_k", config.top_k))
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(
            f"generate({request_id!r}): temperature={temperature} must be >= 0 and top_p={top_p} in (0, 1]"
        )
    stop = params.get("stop_token_ids")
    stop_ids = tuple(int(t) for t in (default_eos if stop is None else stop))
    prompt_logprobs = params.get("prompt_logprobs")
    if prompt_logprobs is not None and (
        isinstance(prompt_logprobs, bool) or not isinstance(prompt_logprobs, int) or prompt_logprobs < 0
    ):
        raise ValueError(
            f"generate({request_id!r}): sampling_params['prompt_logprobs']={prompt_logprobs!r} must be an int >= 0 "
            "(0: each prompt token's log-prob; k: the top-k at each position) or None"
        )
    seed = params.get("seed")
    if seed is None and temperature > 0:
        seed = _request_seed(config.seed, request_id)
    return SamplingSpec(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_tokens=max(0, min(max_tokens, room)),
        seed=None if seed is None else int(seed),
        stop_token_ids=stop_ids,
        ignore_eos=bool(params.get("ignore_eos", config.ignore_eos)),
        logprobs=bool(params.get("logprobs", True)),
        repetition_penalty=float(params.get("repetition_penalty", 1.0)),
        prompt_logprobs=prompt_logprobs,
    )


class RequestState:
    """One request in flight: its prompt, sampling, what it generated so far, and the future of its output."""

    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        spec: SamplingSpec,
        future: concurrent.futures.Future,
        partial: TokenOutput | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = prompt_ids
        self.spec = spec
        self.future = future
        self.token_ids: list[int] = list(partial.token_ids) if partial else []
        self.log_probs: list[float] = list(partial.log_probs or [0.0] * len(self.token_ids)) if partial else []
        self.weight_versions: list[int] = list(partial.weight_versions) if partial else []
        self.num_preempted = int(partial.num_preempted or 0) if partial else 0
        self.admissions = 0  # how often the engine started it (a fresh engine-side id each time)
        # with spec.prompt_logprobs, set by the engine at the first prefill: (ids, log-probs), one row per prompt
        # position (veRL's ``prompt_ids`` / ``prompt_logprobs`` output fields)
        self.prompt_logprobs: tuple[list[list[int]], list[list[float]]] | None = None

    @property
    def context_ids(self) -> list[int]:
        """What the engine prefills: the prompt and the tokens generated so far."""
        return self.prompt_ids + self.token_ids

    @property
    def remaining(self) -> int:
        return self.spec.max_tokens - len(self.token_ids)

    def output(self, stop_reason: str, finish_reason: str, version: int) -> TokenOutput:
        extra: dict[str, Any] = {"finish_reason": finish_reason, "global_steps": version}
        if self.prompt_logprobs is not None:
            extra["prompt_ids"], extra["prompt_logprobs"] = self.prompt_logprobs
        return TokenOutput(
            token_ids=list(self.token_ids),
            log_probs=list(self.log_probs) if self.spec.logprobs else None,
            stop_reason=stop_reason,
            num_preempted=self.num_preempted,
            extra_fields=extra,
            weight_versions=list(self.weight_versions),
        )


def _resolve(future: concurrent.futures.Future, value: Any = None, error: BaseException | None = None) -> None:
    """Set a future once; a future its caller cancelled stays cancelled."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)


class RequestServing:
    """The request API and its engine thread; mixed into :class:`~verl.workers.rollout.base.BaseRollout`.

    Engines call :meth:`_init_serving` in their constructor and set ``_default_eos``, ``_default_pad``,
    ``_vocab_size``; they implement the four ``_serve_*`` hooks and ``_check_ready``.
    """

    def _init_serving(self, max_num_seqs: int, max_model_len: int) -> None:
        self._max_num_seqs = int(max_num_seqs)
        self._max_model_len = int(max_model_len)
        self._engine_lock = threading.RLock()  # held while the engine steps, loads weights or aborts
        self._lock_waiters = 0  # callers waiting for the engine lock: the engine thread lets them in first
        self._cv = threading.Condition()  # guards _incoming and wakes the engine thread
        self._incoming: list[RequestState] = []
        self._waiting: collections.deque[RequestState] = collections.deque()
        self._running: dict[str, RequestState] = {}
        self._known: set[str] = set()  # request ids in flight (incoming, waiting or running)
        self._weight_version = 0
        self._updating = 0
        self._thread: threading.Thread | None = None
        self._stopping = False

    # ------------------------------------------------------------------ engine hooks
    def _serve_admit(self, requests: list[RequestState]) -> None:
        raise NotImplementedError

    def _serve_step(self) -> list[tuple[RequestState, list[int], list[float], str | None]]:
        raise NotImplementedError

    def _serve_release(self, requests: list[RequestState]) -> None:
        raise NotImplementedError

    def _serve_invalidate(self) -> None:
        """Drop prefix caches (KV kept across requests); engines without one keep the default no-op."""

    def _check_ready(self) -> None:
        """Raise when the engine cannot generate now (asleep, weights not loaded)."""

    # ------------------------------------------------------------------ the request API
    @property
    def weight_version(self) -> int:
        """The version of the weights the engine generates with (0: as constructed; +1 per weight load)."""
        return getattr(self, "_weight_version", 0)

    def set_weight_version(self, version: int) -> None:
        """Name the current weights' version (e.g. the trainer's step; veRL's ``set_global_steps``)."""
        with self._engine_turn():
            self._weight_version = int(version)

    def submit(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: Mapping[str, Any] | None = None,
        resume_from: TokenOutput | None = None,
    ) -> concurrent.futures.Future:
        """Queue one request; the future resolves to its :class:`TokenOutput`. Thread-safe, returns at once.

        ``resume_from`` continues an aborted request: its tokens are kept (and prefilled after the prompt), the
        request generates up to ``max_tokens`` in total, and its random stream continues where it stopped.
        """
        return self.submit_many([(request_id, prompt_ids, sampling_params, resume_from)])[0]

    def submit_many(
        self, requests: list[tuple[str, list[int], Mapping[str, Any] | None, TokenOutput | None]]
    ) -> list[concurrent.futures.Future]:
        """Queue several requests at once: they join the running batch together (same arguments as :meth:`submit`)."""
        if not hasattr(self, "_cv"):
            raise NotImplementedError(
                f"{type(self).__name__} does not serve requests: its constructor must call _init_serving() and it "
                f"must implement the _serve_* hooks (see verl.workers.rollout.serving)"
            )
        self._check_ready()
        states = [self._make_request(*request) for request in requests]
        ids = [state.request_id for state in states]
        with self._cv:
            taken = sorted({*ids} & self._known) or sorted({i for i in ids if ids.count(i) > 1})
            if taken:
                raise ValueError(f"generate: request id(s) {taken[:4]} are already in flight")
            self._known.update(ids)
            self._incoming.extend(states)
            self._ensure_thread()
            self._cv.notify()
        return [state.future for state in states]

    def _make_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling_params: Mapping[str, Any] | None,
        resume_from: TokenOutput | None,
    ) -> RequestState:
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"generate: request_id must be a non-empty string, got {request_id!r}")
        prompt_ids = as_token_ids(prompt_ids, f"generate({request_id!r}): prompt_ids")
        if not prompt_ids:
            raise ValueError(f"generate({request_id!r}): prompt_ids is empty")
        bad = [t for t in prompt_ids if not 0 <= t < self._vocab_size]
        if bad:
            raise ValueError(
                f"generate({request_id!r}): prompt token ids {bad[:4]} are outside the vocabulary "
                f"[0, {self._vocab_size})"
            )
        spec = resolve_sampling_params(
            request_id, len(prompt_ids), sampling_params, self.config, self._default_eos, self._max_model_len
        )
        self._check_request(request_id, spec)
        if resume_from is not None and resume_from.log_probs is not None:
            if len(resume_from.log_probs) != len(resume_from.token_ids):
                raise ValueError(f"generate({request_id!r}): resume_from has mismatched token_ids and log_probs")
        return RequestState(request_id, prompt_ids, spec, concurrent.futures.Future(), resume_from)

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: Mapping[str, Any] | None = None,
        image_data: Any = None,
        video_data: Any = None,
        priority: int = 0,
        resume_from: TokenOutput | None = None,
    ) -> TokenOutput:
        """Generate one response (veRL's server signature). Cancelling the awaiting task aborts the request."""
        if image_data is not None or video_data is not None:
            raise NotImplementedError(f"generate({request_id!r}): multi-modal inputs are not supported by this engine")
        if priority:
            raise NotImplementedError(f"generate({request_id!r}): request priorities are not supported (fcfs only)")
        future = self.submit(request_id, prompt_ids, sampling_params, resume_from)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self.abort([request_id])
            raise

    def abort(self, request_ids: Iterable[str] | None = None) -> dict[str, TokenOutput]:
        """Stop requests (None: all) between steps. Returns each one's partial output (``stop_reason="aborted"``),
        which is also what its ``generate`` call returns. Unknown or finished ids are ignored."""
        with self._cv:
            wanted = set(self._known) if request_ids is None else set(request_ids) & self._known
            if not wanted:
                return {}
        with self._engine_turn():
            with self._cv:
                taken = [r for r in self._incoming if r.request_id in wanted]
                self._incoming = [r for r in self._incoming if r.request_id not in wanted]
            taken += [r for r in self._waiting if r.request_id in wanted]
            self._waiting = collections.deque(r for r in self._waiting if r.request_id not in wanted)
            running = [r for rid, r in self._running.items() if rid in wanted]
            if running:
                self._serve_release(running)
                for request in running:
                    del self._running[request.request_id]
            outputs = {}
            for request in taken + running:
                outputs[request.request_id] = request.output("aborted", "abort", self._weight_version)
                self._finish(request, outputs[request.request_id])
            return outputs

    def abort_all_requests(self) -> dict[str, Any]:
        """veRL's server call: abort everything in flight; returns ``aborted_count`` and ``request_ids``."""
        aborted = self.abort(None)
        return {"aborted_count": len(aborted), "request_ids": list(aborted)}

    def progress(self, request_id: str) -> int | None:
        """Tokens a request in flight has generated so far (None: not in flight)."""
        request = self._running.get(request_id)
        if request is None:
            with self._cv:
                request = next((r for r in [*self._incoming, *self._waiting] if r.request_id == request_id), None)
        return None if request is None else len(request.token_ids)

    def num_requests(self) -> int:
        """Requests in flight (queued or running)."""
        with self._cv:
            return len(self._known)

    @contextlib.contextmanager
    def weight_update(self, version: int | None = None) -> Iterator[None]:
        """Hold the engine still for a whole weight sync (several ``update_weights`` buckets count as one load).

        On exit the weight version becomes ``version`` (default: +1), prefix caches are dropped and the running
        requests are preempted, so they continue on KV recomputed with the new weights.
        """
        if not hasattr(self, "_cv"):  # an engine that does not serve requests: nothing to hold still
            yield
            return
        with self._engine_turn():
            self._updating += 1
            try:
                yield
            finally:
                self._updating -= 1
                if not self._updating:
                    self._weights_loaded(version)

    def close(self) -> None:
        """Abort what is in flight and stop the engine thread."""
        self.abort(None)
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    # ------------------------------------------------------------------ generate_sequences over requests
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate ``n`` responses per prompt row (see :class:`BaseRollout` for the keys and
        :func:`~verl.workers.rollout.request.plan_generation` for the meta keys): one request per sample,
        submitted together and gathered."""
        self._check_ready()
        plan = plan_generation(prompts, self.config, self._default_eos, self._default_pad, self._vocab_size)
        outputs = [future.result() for future in self.submit_many(plan_requests(plan, uuid.uuid4().hex))]
        return gather_output(prompts, plan, outputs)

    # ------------------------------------------------------------------ the engine thread
    @contextlib.contextmanager
    def _engine_turn(self) -> Iterator[None]:
        """The engine lock for callers other than the engine thread, granted at the end of the current step (a
        plain lock is unfair: the engine thread would take it back for hundreds of steps)."""
        if self._engine_lock._is_owned():  # re-entrant use (update_weights inside weight_update)
            with self._engine_lock:
                yield
            return
        with self._cv:
            self._lock_waiters += 1
        try:
            self._engine_lock.acquire()
        finally:
            with self._cv:
                self._lock_waiters -= 1
                self._cv.notify_all()
        try:
            yield
        finally:
            self._engine_lock.release()

    def _check_request(self, request_id: str, spec: SamplingSpec) -> None:
        """Engines refuse sampling they cannot do (a ValueError naming the request)."""

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stopping = False
            self._thread = threading.Thread(target=self._serve_loop, name=f"{type(self).__name__}-engine", daemon=True)
            self._thread.start()

    def _serve_loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and (
                    self._lock_waiters or not (self._incoming or self._waiting or self._running)
                ):
                    self._cv.wait()
                if self._stopping:
                    return
                if not self._running and not self._waiting:
                    self._gather_arrivals()
            with self._engine_lock:  # lock order everywhere: the engine lock, then the condition
                with self._cv:
                    self._waiting.extend(self._incoming)
                    self._incoming = []
                try:
                    self._admit()
                    self._deliver(self._serve_step() if self._running else [])
                except BaseException as error:  # every request in flight gets the error: no caller waits forever
                    logger.exception("%s: the engine step failed", type(self).__name__)
                    self._fail_all(error)
                    if not isinstance(error, Exception):
                        raise

    def _gather_arrivals(self) -> None:
        """Waking from idle, let a burst of submissions (``asyncio.gather`` of many ``generate`` calls) arrive
        before the first prefill, so they join as one batch: wait while requests keep coming, up to
        ``_ARRIVAL_WINDOW_S``. Called with ``_cv`` held."""
        deadline = time.monotonic() + _ARRIVAL_WINDOW_S
        seen = -1
        while len(self._incoming) != seen and len(self._incoming) < self._max_num_seqs and not self._stopping:
            seen = len(self._incoming)
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cv.wait(min(left, _ARRIVAL_GAP_S))

    def _admit(self) -> None:
        free = self._max_num_seqs - len(self._running)
        admitted = []
        while self._waiting and len(admitted) < free:
            request = self._waiting.popleft()
            if request.future.cancelled():
                self._forget(request)
                continue
            if request.remaining <= 0:  # nothing left to generate (e.g. resumed at max_tokens)
                self._finish(request, request.output("completed", "length", self._weight_version))
                continue
            request.admissions += 1
            admitted.append(request)
            self._running[request.request_id] = request  # before its prefill: in flight all along
        if admitted:
            self._serve_admit(admitted)

    def _deliver(self, events: list[tuple[RequestState, list[int], list[float], str | None]]) -> None:
        version = self._weight_version
        for request, tokens, log_probs, finish_reason in events:
            request.token_ids.extend(tokens)
            request.log_probs.extend(log_probs)
            request.weight_versions.extend([version] * len(tokens))
            if finish_reason is not None:
                self._running.pop(request.request_id, None)
                self._finish(request, request.output("completed", finish_reason, version))
        cancelled = [r for r in self._running.values() if r.future.cancelled()]
        if cancelled:
            self._serve_release(cancelled)
            for request in cancelled:
                del self._running[request.request_id]
                self._forget(request)

    def _weights_loaded(self, version: int | None) -> None:
        self._weight_version = self._weight_version + 1 if version is None else int(version)
        running = list(self._running.values())
        if running:
            self._serve_release(running)
            self._running.clear()
            for request in running:
                request.num_preempted += 1
            self._waiting.extendleft(reversed(running))
            logger.info("weight version %d: %d running request(s) preempted", self._weight_version, len(running))
        self._serve_invalidate()

    def _fail_all(self, error: BaseException) -> None:
        with self._cv:
            incoming, self._incoming = self._incoming, []
        failed = incoming + list(self._waiting) + list(self._running.values())
        self._waiting.clear()
        if self._running:
            with contextlib.suppress(Exception):
                self._serve_release(list(self._running.values()))
            self._running.clear()
        for request in failed:
            wrapped = RuntimeError(f"generate({request.request_id!r}) failed in the engine step: {error}")
            wrapped.__cause__ = error
            self._forget(request)
            _resolve(request.future, error=wrapped)

    def _finish(self, request: RequestState, output: TokenOutput) -> None:
        self._forget(request)
        _resolve(request.future, output)

    def _forget(self, request: RequestState) -> None:
        with self._cv:
            self._known.discard(request.request_id)
