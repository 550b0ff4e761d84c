"""The gateway's HTTP server: the parts of OpenAI's API that agents use, served from our rollout servers.

Routes (``base_url`` is ``http://127.0.0.1:<port>/v1``): ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models``. A request names its session by its API key (``Authorization: Bearer <key>``, what the ``openai``
client sends for ``api_key``); an unknown or ended session gets 401. ``stream: true`` answers with server-sent events
(``data: {chunk}`` … ``data: [DONE]``) whose deltas add up to the non-streamed message; errors are OpenAI's error
object. The server runs in the process and event loop of the agent loops that open sessions on it (one per agent-loop
worker process: :func:`shared_gateway`), bound to the loopback interface.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

from aiohttp import web

from verl.experimental.agent_gateway.session import Choice, GatewaySession, RequestError

__all__ = ["AgentGateway", "shared_gateway"]

logger = logging.getLogger(__name__)


def _logprobs_chat(choice: Choice, tokenizer: Any) -> dict[str, Any]:
    content = []
    for token_id, logprob in zip(choice.token_ids, choice.logprobs):
        token = tokenizer.decode([token_id], skip_special_tokens=False)
        content.append({"token": token, "logprob": float(logprob), "bytes": list(token.encode()), "top_logprobs": []})
    return {"content": content}


def _logprobs_text(choice: Choice, tokenizer: Any) -> dict[str, Any]:
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in choice.token_ids]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [float(x) for x in choice.logprobs],
        "top_logprobs": None,
        "text_offset": offsets,
    }


def _message(choice: Choice) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": choice.text}
    if choice.tool_calls:
        message["tool_calls"] = choice.tool_calls
    return message


def _usage(prompt_tokens: int, choices: list[Choice]) -> dict[str, int]:
    completion = sum(len(c.token_ids) for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


class AgentGateway:
    """An OpenAI-compatible HTTP server over sessions (see the module docstring).

    Args:
        host: the interface to bind (loopback by default: agents run on the same machine).
        port: the port (0: any free one).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.sessions: dict[str, GatewaySession] = {}
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        """The URL agents are given (``.../v1``)."""
        if self._runner is None:
            raise RuntimeError("the gateway is not started")
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> str:
        """Start serving on the running event loop; returns :attr:`base_url`."""
        if self._runner is not None:
            return self.base_url
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # the port picked for port 0
        self._runner = runner
        logger.info("agent gateway serving at %s", self.base_url)
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open(self, session: GatewaySession) -> str:
        """Register ``session``; returns its API key."""
        key = f"verl-{uuid.uuid4().hex}"
        self.sessions[key] = session
        return key

    def close(self, key: str) -> GatewaySession:
        """End the session of ``key``: later requests with it get 401."""
        session = self.sessions.pop(key)
        session.closed = True
        return session

    # ------------------------------------------------------------------ handlers
    def _session(self, request: web.Request) -> GatewaySession:
        auth = request.headers.get("Authorization", "")
        key = auth.removeprefix("Bearer ").strip()
        session = self.sessions.get(key)
        if session is None:
            raise RequestError("unknown or ended session (the API key names none)", code="invalid_api_key", status=401)
        return session

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except ValueError as e:
            raise RequestError(f"the body is not JSON: {e}") from e
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        return body

    async def _models(self, request: web.Request) -> web.Response:
        try:
            session = self._session(request)
        except RequestError as e:
            return web.json_response(e.body(), status=e.status)
        return web.json_response(
            {"object": "list", "data": [{"id": session.model, "object": "model", "created": 0, "owned_by": "verl"}]}
        )

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            session = self._session(request)
            body = await self._body(request)
        except RequestError as e:
            return web.json_response(e.body(), status=e.status)
        try:
            choices, turn = await (session.chat(body) if chat else session.complete(body))
        except RequestError as e:
            return web.json_response(e.body(), status=e.status)
        except Exception as e:  # noqa: BLE001 - the agent hears of it as a 500; the session fails its sample with it
            logger.exception("gateway: serving a request failed")
            session.server_error(e)
            return web.json_response(RequestError(f"{type(e).__name__}: {e}", status=500).body(), status=500)
        tokenizer = session.capture.tokenizer
        want_logprobs = bool(body.get("logprobs"))
        created, rid = int(time.time()), f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        base = {"id": rid, "created": created, "model": session.model}
        if body.get("stream"):
            return await self._stream(request, base, choices, chat, want_logprobs, tokenizer)
        out = []
        for i, choice in enumerate(choices):
            entry: dict[str, Any] = {"index": i, "finish_reason": choice.finish_reason}
            if chat:
                entry["message"] = _message(choice)
                entry["logprobs"] = _logprobs_chat(choice, tokenizer) if want_logprobs else None
            else:
                entry["text"] = choice.text
                entry["logprobs"] = _logprobs_text(choice, tokenizer) if want_logprobs else None
            out.append(entry)
        result = {
            **base,
            "object": "chat.completion" if chat else "text_completion",
            "choices": out,
            "usage": _usage(len(turn.prompt_ids), choices),
        }
        return web.json_response(result)

    async def _stream(
        self, request: web.Request, base: dict[str, Any], choices: list[Choice], chat: bool, logprobs: bool, tokenizer
    ) -> web.StreamResponse:
        """Server-sent events: per choice, a chunk with the role (chat), one with the content (and the log-probs),
        one with the tool calls, one with the finish reason; then ``[DONE]``."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"

        async def send(index: int, payload: dict[str, Any], finish: str | None = None) -> None:
            chunk = {**base, "object": kind, "choices": [{"index": index, **payload, "finish_reason": finish}]}
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        for i, choice in enumerate(choices):
            if chat:
                await send(i, {"delta": {"role": "assistant", "content": ""}, "logprobs": None})
                lp = _logprobs_chat(choice, tokenizer) if logprobs else None
                await send(i, {"delta": {"content": choice.text}, "logprobs": lp})
                if choice.tool_calls:
                    calls = [{"index": k, **call} for k, call in enumerate(choice.tool_calls)]
                    await send(i, {"delta": {"tool_calls": calls}, "logprobs": None})
                await send(i, {"delta": {}, "logprobs": None}, choice.finish_reason)
            else:
                lp = _logprobs_text(choice, tokenizer) if logprobs else None
                await send(i, {"text": choice.text, "logprobs": lp})
                await send(i, {"text": "", "logprobs": None}, choice.finish_reason)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


_gateways: dict[int, AgentGateway] = {}
_starting: dict[int, asyncio.Lock] = {}


async def shared_gateway() -> AgentGateway:
    """The process's gateway on the running event loop (started on first use)."""
    loop_id = id(asyncio.get_running_loop())
    lock = _starting.setdefault(loop_id, asyncio.Lock())
    async with lock:
        gateway = _gateways.get(loop_id)
        if gateway is None:
            gateway = AgentGateway()
            await gateway.start()
            _gateways[loop_id] = gateway
    return gateway
