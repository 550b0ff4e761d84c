"""The reward model's router: an HTTP address that reward functions call, in front of the reward model's replicas.

:class:`RewardRouter` is a Ray actor serving, on its node (``reward_router_address`` = ``host:port``), the parts of
OpenAI's API a judge function uses — the way veRL's users call their generative reward model:

- ``POST /v1/chat/completions``: ``messages`` rendered with the reward model's chat template (generation prompt
  added) → ``choices[i].message.content``;
- ``POST /v1/completions``: ``prompt`` (text, tokenized with the model's special tokens, or token ids) →
  ``choices[i].text``;
- sampling keys ``max_tokens`` (default ``reward.reward_model.rollout.response_length``), ``temperature`` [1.0],
  ``top_p`` [1.0], ``top_k``, ``seed``, ``n`` [1]; each reply has ``usage`` (prompt and completion tokens) and a
  ``finish_reason`` (``length`` when ``max_tokens`` ran out, else ``stop``);
- ``POST /classify`` (vLLM's, for a discriminative reward model): ``input`` → ``data[i].probs``, the model's
  outputs at the last token (``use_activation`` [true] applies a softmax, a sigmoid for one label);
- ``GET /v1/models`` and ``GET /health`` (503 until a replica serves).

Each request goes to a replica through the request API (:class:`~verl.experimental.agent_loop.AsyncLLMServerManager`:
least outstanding requests, continuous batching in the engine). A malformed request is answered 400 naming what is
wrong; a failing replica 500 with its error: the judge function sees it, and the reward loop counts it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

__all__ = ["RewardModelTokenizer", "RewardRouter", "reward_router", "start_reward_router"]

logger = logging.getLogger(__name__)

ROUTER_NAME = "verl_reward_router"
_HANDLES: dict[str, Any] = {}


class RequestError(ValueError):
    """A request the router cannot serve as written (answered 400)."""


def _sampling(body: dict[str, Any], default_max_tokens: int) -> dict[str, Any]:
    """Our sampling params from an OpenAI request body."""
    limits = ("max_tokens", "max_completion_tokens")
    params: dict[str, Any] = {
        "max_tokens": int(next((body[k] for k in limits if body.get(k) is not None), default_max_tokens)),
        "temperature": float(body.get("temperature", 1.0)),
        "top_p": float(body.get("top_p", 1.0)),
        "top_k": int(body.get("top_k", -1)),
        "logprobs": False,
    }
    if body.get("seed") is not None:
        params["seed"] = int(body["seed"])
    if params["max_tokens"] <= 0:
        raise RequestError(f"max_tokens={params['max_tokens']} must be positive")
    return params


class RewardRouter:
    """The router (see the module docstring); a Ray async actor.

    Args:
        tokenizer_path: the reward model's tokenizer (its chat template renders the messages).
        model_name: what ``/v1/models`` lists and replies name (the reward model's path).
        default_max_tokens: ``max_tokens`` of a request that gives none.
    """

    def __init__(self, tokenizer_path: str, model_name: str, default_max_tokens: int = 512) -> None:
        from verl.utils.hf_tokenizer import hf_tokenizer

        self.tokenizer = hf_tokenizer(tokenizer_path)
        self.model_name = model_name
        self.default_max_tokens = int(default_max_tokens)
        self.client: Any = None  # routes generation requests
        self.classifiers: list[Any] = []  # a discriminative model's replicas, round-robin
        self._next_classifier = 0
        self.served = self.failed = 0
        self._runner: Any = None
        self.address: str | None = None

    async def start(self) -> str:
        """Listen on this node (once); returns ``host:port``."""
        from aiohttp import web

        if self.address is not None:
            return self.address
        from verl.utils.net_utils import node_ip_and_free_port

        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/classify", self._classify)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        host, port = node_ip_and_free_port()
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "0.0.0.0", port).start()
        self.address = f"{host}:{port}"
        logger.info("reward router at http://%s", self.address)
        return self.address

    async def add_servers(self, handles: list[Any], discriminative: bool = False) -> int:
        """Route to ``handles`` (the replicas' :class:`~verl.experimental.agent_loop.server_manager.ServerHandle` s)
        too — generation requests, or ``/classify`` for a discriminative model's; returns how many replicas of
        that kind it routes to."""
        from verl.experimental.agent_loop.server_manager import AsyncLLMServerManager

        if discriminative:
            self.classifiers.extend(handles)
            return len(self.classifiers)
        if self.client is None:
            self.client = AsyncLLMServerManager(None, handles)
        else:
            self.client.add_servers(handles)
        return len(self.client.server_handles)

    async def stats(self) -> dict[str, int]:
        """Requests served and failed so far."""
        return {"served": self.served, "failed": self.failed}

    # ------------------------------------------------------------------ the routes
    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        ready = self.client is not None or bool(self.classifiers)
        return web.json_response({"ok": ready}, status=200 if ready else 503)

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": self.model_name, "object": "model"}]})

    async def _chat(self, request: Any) -> Any:
        return await self._serve(request, chat=True)

    async def _completions(self, request: Any) -> Any:
        return await self._serve(request, chat=False)

    async def _classify(self, request: Any) -> Any:
        """vLLM's ``/classify``: ``input`` (a text, a list of texts, token ids or a list of them) → ``data[i].probs``
        (the model's outputs at the last token of input ``i``; ``use_activation`` [true]: softmax over the labels,
        a sigmoid for one label)."""
        import math

        from aiohttp import web

        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            inputs = self._classify_inputs(body.get("input"))
        except (RequestError, ValueError, TypeError) as e:
            return web.json_response({"error": {"message": str(e), "type": "invalid_request_error"}}, status=400)
        if not self.classifiers:
            return web.json_response({"error": {"message": "no discriminative reward model serves"}}, status=503)
        handle = self.classifiers[self._next_classifier % len(self.classifiers)]
        self._next_classifier += 1
        try:
            rows = await getattr(handle.actor, f"{handle.prefix}classify").remote(inputs)
        except Exception as e:  # noqa: BLE001 - the replica's failure is the caller's answer
            self.failed += 1
            message = f"{handle.name} failed: {type(e).__name__}: {e}"
            return web.json_response({"error": {"message": message, "type": "server_error"}}, status=500)
        if body.get("use_activation", True):
            if all(len(r) == 1 for r in rows):
                rows = [[1.0 / (1.0 + math.exp(-r[0]))] for r in rows]
            else:
                rows = [[math.exp(v - max(r)) / sum(math.exp(u - max(r)) for u in r) for v in r] for r in rows]
        self.served += 1
        data = [{"index": i, "object": "classification", "probs": r, "num_classes": len(r)} for i, r in enumerate(rows)]
        tokens = sum(len(ids) for ids in inputs)
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return web.json_response({"object": "list", "model": self.model_name, "data": data, "usage": usage})

    def _classify_inputs(self, value: Any) -> list[list[int]]:
        """Token id lists from ``/classify``'s ``input``."""
        if isinstance(value, str) or (isinstance(value, list) and value and all(isinstance(t, int) for t in value)):
            value = [value]
        if not isinstance(value, list) or not value:
            raise RequestError("'input' must be a text, token ids, or a non-empty list of them")
        out = []
        for item in value:
            if isinstance(item, str) and item:
                out.append(list(self.tokenizer(item)["input_ids"]))
            elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
                out.append(list(item))
            else:
                raise RequestError("'input' must be a text, token ids, or a non-empty list of them")
        return out

    def _prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int]:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError("'messages' must be a non-empty list of {'role', 'content'} objects")
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return list(self.tokenizer(ids, add_special_tokens=False)["input_ids"])
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            return list(self.tokenizer(prompt)["input_ids"])
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise RequestError("'prompt' must be a non-empty string or a list of token ids")

    async def _serve(self, request: Any, chat: bool) -> Any:
        from aiohttp import web

        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
            prompt_ids = self._prompt_ids(body, chat)
            params = _sampling(body, self.default_max_tokens)
            n = int(body.get("n", 1))
            if n < 1:
                raise RequestError(f"n={n} must be at least 1")
        except (RequestError, ValueError, TypeError) as e:
            return web.json_response({"error": {"message": str(e), "type": "invalid_request_error"}}, status=400)
        if self.client is None:
            return web.json_response({"error": {"message": "no reward model replica serves yet"}}, status=503)
        request_id = uuid.uuid4().hex
        try:
            outputs = await asyncio.gather(
                *(
                    self.client.generate(
                        f"{request_id}-{i}",
                        prompt_ids=prompt_ids,
                        sampling_params={**params, **({"seed": params["seed"] + i} if "seed" in params else {})},
                    )
                    for i in range(n)
                )
            )
        except Exception as e:  # noqa: BLE001 - the replica's failure is the caller's answer
            self.failed += 1
            replica = self._replica_of(f"{request_id}-0")
            logger.warning("reward router: %s failed on request %s: %s", replica, request_id, e)
            message = f"{replica} failed: {type(e).__name__}: {e}"
            return web.json_response({"error": {"message": message, "type": "server_error"}}, status=500)
        self.served += 1
        return web.json_response(self._reply(request_id, chat, prompt_ids, outputs, params["max_tokens"]))

    def _replica_of(self, request_id: str) -> str:
        """The name of the replica a request went to (e.g. ``reward_model rank 0``)."""
        index = self.client.server_of(request_id)
        return "a reward model replica" if index is None else str(self.client.server_handles[index].name)

    def _reply(self, request_id: str, chat: bool, prompt_ids: list[int], outputs: list[Any], max_tokens: int) -> dict:
        choices = []
        for i, output in enumerate(outputs):
            text = self.tokenizer.decode(output.token_ids, skip_special_tokens=True)
            finish = "length" if len(output.token_ids) >= max_tokens else "stop"
            choice: dict[str, Any] = {"index": i, "finish_reason": finish}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            choices.append(choice)
        completion_tokens = sum(len(o.token_ids) for o in outputs)
        return {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{request_id}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt_ids),
                "completion_tokens": completion_tokens,
                "total_tokens": len(prompt_ids) + completion_tokens,
            },
        }


class RewardModelTokenizer:
    """The reward model's tokenizer as reward functions get it (``reward_model_tokenizer``): the tokenizer of
    ``path``, loaded on first use in each process (it travels to the scoring processes as its path)."""

    _loaded: dict[str, Any] = {}

    def __init__(self, path: str) -> None:
        self.path = path

    def _tokenizer(self) -> Any:
        if self.path not in self._loaded:
            from verl.utils.hf_tokenizer import hf_tokenizer

            self._loaded[self.path] = hf_tokenizer(self.path)
        return self._loaded[self.path]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "path":
            raise AttributeError(name)
        return getattr(self._tokenizer(), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer()(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._tokenizer())


def start_reward_router(tokenizer_path: str, model_name: str, default_max_tokens: int = 512) -> tuple[Any, str]:
    """The run's router actor (started on this node by the first caller) and its address."""
    import ray

    actor = _HANDLES.get(ROUTER_NAME)
    if actor is None:  # the router lives while the process that started it holds this handle
        actor = (
            ray.remote(RewardRouter)
            .options(name=ROUTER_NAME, get_if_exists=True, num_cpus=0, max_concurrency=1000)
            .remote(tokenizer_path, model_name, default_max_tokens)
        )
        _HANDLES[ROUTER_NAME] = actor
    return actor, ray.get(actor.start.remote())


def reward_router(config: Any) -> tuple[Any, str]:
    """The router of the run's served reward model (``reward.reward_model``): its actor and address."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError(
            "reward.reward_model.enable with a custom reward function serves the reward model behind a router, "
            "which needs Ray: call ray.init() before building the reward function"
        )
    rm = config.reward.reward_model
    return start_reward_router(rm.model_path, rm.model_path, int((rm.get("rollout") or {}).get("response_length", 512)))
