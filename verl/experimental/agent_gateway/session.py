"""One agent's session at the gateway: its requests served by our rollout servers and captured token for token.

A session belongs to one sample. It holds the sample's server client (the request API: every request of the session
goes out under the session's id, so the server manager keeps the conversation on one server and its prefix cache;
choice ``k > 0`` of an ``n > 1`` request under ``<id>.<k>``),
the run's sampling parameters, the length budget of a trajectory (``rollout.prompt_length`` for the first prompt,
``rollout.response_length`` for everything after it) and the :class:`~.capture.ConversationCapture`.

What a request may set and what happens to it:

- ``max_tokens`` / ``max_completion_tokens``: honoured, capped by what is left of the response budget; a request with
  no budget left is refused (``context_length_exceeded``) and counted (``over_budget_requests``).
- ``temperature`` / ``top_p``: the run's values are used, because the trainer's log-probs assume them; a request
  asking for other values is counted (``ignored_sampling_params``) and a warning is logged once per process —
  unless the loop is configured with ``honor_request_sampling: true``.
- ``stop`` (a string or a list): generation is cut after the first token whose text completes a stop string; the
  tokens after it are discarded (they were never shown to the agent) and the stop string is not returned (OpenAI's
  rule). Counted as ``stop_cuts``.
- ``n``: that many generations of the same prompt, each its own trajectory.
- ``logprobs``: the policy's log-probs of the returned tokens (``top_logprobs`` are not served: 0 alternatives).
- not served, refused by name when set to anything but their default: ``response_format``, ``tool_choice`` other than
  ``auto``, ``logit_bias``, presence / frequency penalties, ``top_logprobs``, ``echo``, ``suffix``, ``best_of``,
  the legacy ``functions`` / ``function_call``, ``audio``, ``prediction``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from verl.experimental.agent_gateway.capture import ConversationCapture, Generation, Turn, normalize_messages
from verl.experimental.agent_loop.server_manager import token_versions

__all__ = ["Choice", "GatewaySession", "RequestError"]

logger = logging.getLogger(__name__)

_warned_sampling = False

# OpenAI parameters the gateway does not implement, with the values that mean "not used"; any other value is refused
# by name (an agent that relies on one must not be served as if it had not asked)
_UNSERVED: dict[str, tuple[Any, ...]] = {
    "response_format": (None, {"type": "text"}),
    "tool_choice": (None, "auto"),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "functions": (None, []),
    "function_call": (None, "auto"),
    "audio": (None,),
    "prediction": (None,),
}


class RequestError(Exception):
    """A request the gateway refuses: OpenAI's error object with an HTTP status."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.code, self.status = param, code, status

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": self.code}}


def _number(body: dict[str, Any], key: str, kind: type) -> Any:
    """``body[key]`` as an int or a float (None when absent); a value that is not a number is refused by name."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise RequestError(f"{key}={value!r} is not a{'n integer' if kind is int else ' number'}", param=key)
    return kind(value)


@dataclass(frozen=True)
class Choice:
    """One generation as the gateway returns it."""

    token_ids: list[int]
    logprobs: list[float]
    text: str  # the generated text (completions) or the reply's content (chat)
    tool_calls: list[dict[str, Any]]
    finish_reason: str


@dataclass
class GatewaySession:
    """One sample's agent session (see the module docstring).

    Args:
        session_id: the request id every generation of the session is sent under.
        client: the sample's server client (``await client.generate(request_id, prompt_ids=, sampling_params=)``).
        capture: the conversation's token capture.
        sampling_params: the run's sampling parameters (temperature, top_p, top_k, logprobs, stop_token_ids).
        prompt_length / response_length: the trajectory budget.
        tool_parser: the policy's tool-call parser (``rollout.multi_turn.format``); None: no tool calls parsed.
        model: the model name the gateway reports.
        honor_request_sampling: use the request's temperature / top_p instead of the run's.
        max_requests: requests the session may make; later ones are refused (``too_many_requests``).
    """

    session_id: str
    client: Any
    capture: ConversationCapture
    sampling_params: dict[str, Any]
    prompt_length: int
    response_length: int
    tool_parser: Any = None
    model: str = "policy"
    honor_request_sampling: bool = False
    max_requests: int = 64
    counters: dict[str, int] = field(
        default_factory=lambda: {
            "over_budget_requests": 0,
            "ignored_sampling_params": 0,
            "stop_cuts": 0,
            "refused_requests": 0,
            "server_errors": 0,
        }
    )
    first_error: str | None = None  # the first request the gateway failed to serve (HTTP 500)
    request_ids: set[str] = field(default_factory=set)  # the ids its generations went out under
    closed: bool = False
    generate_seconds: float = 0.0  # wall time of the session's generate calls

    # ------------------------------------------------------------------ requests
    async def chat(self, body: dict[str, Any]) -> tuple[list[Choice], Turn]:
        """Serve a Chat Completions body: the choices, and the turn they answer."""
        self._admit(body)
        try:
            messages = normalize_messages(body.get("messages"))
        except ValueError as e:
            raise RequestError(str(e), param="messages") from e
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise RequestError("'tools' must be a list of tool definitions", param="tools")
        turn = self.capture.chat_turn(messages, tools)
        choices = await self._generate(turn, body, chat=True)
        return choices, turn

    async def complete(self, body: dict[str, Any]) -> tuple[list[Choice], Turn]:
        """Serve a Completions body (``prompt``: one string or one list of token ids)."""
        self._admit(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))):
            raise RequestError("'prompt' must be one string or one list of token ids", param="prompt")
        turn = self.capture.text_turn(prompt)
        choices = await self._generate(turn, body, chat=False)
        return choices, turn

    def _admit(self, body: dict[str, Any]) -> None:
        """Refuse a request of an ended session, one past ``max_requests``, or one asking for what is not served."""
        for key, served in _UNSERVED.items():
            if key in body and body[key] not in served:
                raise RequestError(f"{key}={body[key]!r} is not served by the gateway", param=key)
        if self.closed:
            raise RequestError("the session has ended (its sample is done)", code="session_closed", status=401)
        if self.capture.counters["requests"] >= self.max_requests:
            self.counters["refused_requests"] += 1
            raise RequestError(
                f"the session made {self.max_requests} requests, its limit (max_requests)",
                code="too_many_requests",
                status=429,
            )

    # ------------------------------------------------------------------ generation
    def _params(self, body: dict[str, Any], turn: Turn) -> tuple[dict[str, Any], list[str]]:
        global _warned_sampling
        params = dict(self.sampling_params)
        for key in ("temperature", "top_p"):
            value = _number(body, key, float)
            if value is None or value == float(params.get(key, value)):
                continue
            if self.honor_request_sampling:
                params[key] = float(value)
                continue
            self.counters["ignored_sampling_params"] += 1
            if not _warned_sampling:
                _warned_sampling = True
                logger.warning(
                    "gateway: a request asks for %s=%s; the run's %s=%s is used (the trainer's log-probs assume it; "
                    "set honor_request_sampling: true in the loop's YAML entry to use the request's)",
                    key,
                    value,
                    key,
                    params.get(key),
                )
        if turn.base is None:
            if len(turn.prompt_ids) > self.prompt_length:
                self.counters["over_budget_requests"] += 1
                raise RequestError(
                    f"the prompt has {len(turn.prompt_ids)} tokens, more than rollout.prompt_length="
                    f"{self.prompt_length}",
                    param="messages",
                    code="context_length_exceeded",
                )
            left = self.response_length
        else:
            left = self.response_length - len(turn.base.response_ids) - len(turn.appended)
        asked = _number(body, "max_completion_tokens", int)
        asked = _number(body, "max_tokens", int) if asked is None else asked
        if asked is not None and asked < 1:
            raise RequestError("max_tokens must be at least 1", param="max_tokens")
        if left < 1:
            self.counters["over_budget_requests"] += 1
            raise RequestError(
                f"the conversation has used its {self.response_length} response tokens (rollout.response_length)",
                param="messages",
                code="context_length_exceeded",
            )
        params["max_tokens"] = left if asked is None else min(asked, left)
        params["logprobs"] = True
        stop = body.get("stop")
        stops = [stop] if isinstance(stop, str) else [str(s) for s in (stop or [])]
        return params, [s for s in stops if s]

    async def _generate(self, turn: Turn, body: dict[str, Any], chat: bool) -> list[Choice]:
        n = _number(body, "n", int)
        n = 1 if n is None else n
        if n < 1:
            raise RequestError("n must be at least 1", param="n")
        params, stops = self._params(body, turn)
        if chat and self.tool_parser is not None:
            extra = [t for t in self.tool_parser.stop_token_ids if t not in (params.get("stop_token_ids") or [])]
            params["stop_token_ids"] = [*(params.get("stop_token_ids") or []), *extra]
        ids = [self.session_id if k == 0 else f"{self.session_id}.{k}" for k in range(n)]
        self.request_ids.update(ids)
        start = time.perf_counter()
        outputs = await asyncio.gather(
            *(
                self.client.generate(request_id, prompt_ids=list(turn.prompt_ids), sampling_params=params)
                for request_id in ids
            )
        )
        self.generate_seconds += time.perf_counter() - start
        if self.closed:  # the sample ended while this request generated: its tokens belong to no trajectory
            raise RequestError("the session has ended (its sample is done)", code="session_closed", status=401)
        choices, generations = [], []
        for output in outputs:
            ids, logprobs, versions = list(output.token_ids), list(output.log_probs or []), token_versions(output)
            if len(logprobs) != len(ids):
                raise RequestError("the rollout server returned no log-probs", status=500)
            finish = str(output.extra_fields.get("finish_reason") or "stop")
            cut = self._stop_cut(ids, stops)
            if cut is not None:
                ids, logprobs, versions, finish = ids[:cut], logprobs[:cut], versions[:cut], "stop"
                self.counters["stop_cuts"] += 1
            choice, reply = await self._reply(ids, logprobs, finish, stops, chat, body.get("tools"))
            choices.append(choice)
            generations.append(Generation(ids, logprobs, versions, reply))
        self.capture.record(turn, generations)
        return choices

    def _stop_cut(self, ids: list[int], stops: list[str]) -> int | None:
        """The number of tokens up to the one that completes the first stop string; None: no stop string. (A
        prefix that holds a stop string stays holding it as it grows: a binary search over the prefixes.)"""

        def holds(k: int) -> bool:
            text = self.capture.tokenizer.decode(ids[:k], skip_special_tokens=True)
            return any(stop in text for stop in stops)

        if not stops or not holds(len(ids)):
            return None
        low, high = 1, len(ids)
        while low < high:
            middle = (low + high) // 2
            if holds(middle):
                high = middle
            else:
                low = middle + 1
        return low

    async def _reply(
        self, ids: list[int], logprobs: list[float], finish: str, stops: list[str], chat: bool, tools: Any
    ) -> tuple[Choice, Any]:
        """The choice returned to the agent, and the reply recorded with the trajectory (the normalized assistant
        message for chat, the returned text for completions)."""
        tokenizer = self.capture.tokenizer
        seen = tokenizer.decode(ids, skip_special_tokens=True)  # the generated text, a stop string included
        if not chat or self.tool_parser is None:
            text, calls = seen, []
        else:
            text, parsed, _ = await self.tool_parser.parse(ids, None)
            calls = [
                {
                    "id": call.tool_call_id or f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for i, call in enumerate(parsed)
            ]
        for stop in stops:
            if stop in text:
                text = text[: text.index(stop)]
        if calls and finish == "stop":
            finish = "tool_calls"
        choice = Choice(ids, logprobs, text, calls, finish)
        if not chat:
            return choice, seen
        message = {"role": "assistant", "content": text, "tool_calls": calls or None}
        return choice, normalize_messages([message])[0]

    def server_error(self, error: BaseException) -> None:
        """Note a request the gateway failed to serve: the sample fails with it (see ``GatewayAgentLoop``)."""
        self.counters["server_errors"] += 1
        if self.first_error is None:
            self.first_error = f"{type(error).__name__}: {error}"

    def snapshot(self) -> dict[str, int]:
        """The session's counters and its capture's."""
        return {**self.capture.snapshot(), **self.counters}
