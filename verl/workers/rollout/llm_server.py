"""veRL 0.10's server classes (``verl.workers.rollout.llm_server``) over our rollout servers.

Our rollout servers are the workers that host a rollout engine: the training workers of the hybrid engine (role
``actor_rollout``), or workers of role ``rollout`` on a pool of their own. Each worker is one replica, reached
through its :func:`~verl.single_controller.base.decorator.server_method` s (``generate``, ``abort_requests``) as a
:class:`~verl.experimental.agent_loop.server_manager.ServerHandle`. The classes here put veRL 0.10's names on them:

- :class:`GlobalRequestLoadBalancer` — sticky by request id (an LRU of ``max_cache_size`` ids), otherwise the
  server with the fewest requests in flight (ties: the first registered); with ``full_determinism``, a stable hash
  of the request id. A plain class; :class:`LLMServerManager` runs it as a Ray actor shared by every client.
- :class:`LLMServerClient` — ``async generate(request_id, *, prompt_ids, sampling_params, ...) -> TokenOutput``
  through the balancer. Each turn goes to the server under an id of its own (``<request_id>/<turn>``) and a seeded
  request gets a fresh seed per later turn, as :class:`~verl.experimental.agent_loop.AsyncLLMServerManager` does;
  ``extra_fields`` gains ``min_global_steps`` / ``max_global_steps``: the oldest and newest weight version among the
  output's tokens (our engines record one per token).
- :class:`FullyAsyncLLMServerClient` — a request that comes back aborted is sent again with the tokens so far
  appended to the prompt and the rest of the ``max_tokens`` budget, until it completes; the outputs are merged.
- :class:`ServerReplica` — one server as veRL's ``RolloutReplica`` (``sleep``, ``wake_up``,
  ``abort_all_requests``, ...), what :class:`LLMServerManager.get_replicas` returns and
  :class:`~verl.checkpoint_engine.CheckpointEngineManager` drives.
- :class:`LLMServerManager` — ``create(config, worker_group=...)`` wraps the group's workers as replicas and starts
  the balancer; ``get_client()`` returns a client for the agent loops.

Where ours differs from veRL's: the servers are Ray actors, not HTTP servers, so a replica's ``server_address`` is a
name (``<worker group>:<rank>``), not an OpenAI endpoint; servers are never launched here (``worker_group=None``,
veRL's standalone launch, is refused: our servers on a pool of their own are started by the trainer); ``priority``
is accepted and dropped (our engines serve first come, first served); audio inputs are refused.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterable
from typing import Any

from verl.utils.ray_utils import auto_await
from verl.utils.token_ids import as_token_ids
from verl.workers.rollout.load_balancer import DEFAULT_ROUTING_CACHE_SIZE, NO_SERVERS, GlobalRequestLoadBalancer
from verl.workers.rollout.replica import TokenOutput

# Torch-free at import (the balancer's Ray actor imports this module and nothing else): the agent-loop pieces the
# clients and replicas compose are imported where they are used.

__all__ = [
    "DEFAULT_ROUTING_CACHE_SIZE",
    "FullyAsyncLLMServerClient",
    "GlobalRequestLoadBalancer",
    "LLMServerClient",
    "LLMServerManager",
    "ServerReplica",
]

logger = logging.getLogger(__name__)


def _config_get(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` for a mapping or an attribute object; ``default`` when absent or when ``config`` is None."""
    if config is None:
        return default
    if hasattr(config, "get"):
        return config.get(key, default)
    return getattr(config, key, default)


def _rollout_section(config: Any) -> Any:
    return _config_get(_config_get(config, "actor_rollout_ref"), "rollout")


class LLMServerClient:
    """Sends an agent loop's requests to the servers the balancer picks (see the module docstring).

    Args:
        config: the trainer config (``actor_rollout_ref.rollout`` is read).
        load_balancer_handle: the balancer: a Ray actor of :class:`GlobalRequestLoadBalancer` (what
            :meth:`LLMServerManager.get_client` passes) or a plain instance of it.
        max_cache_size: conversations whose turns are counted (per-turn server ids and seeds).
    """

    def __init__(
        self, config: Any, load_balancer_handle: Any = None, max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE
    ) -> None:
        self.config = config
        self._load_balancer = load_balancer_handle
        self._max_cache_size = max_cache_size
        self._turns: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._in_flight: dict[str, tuple[str, Any, str]] = {}  # conversation → (server id, handle, server-side id)

    # ------------------------------------------------------------------ the balancer
    def _balancer_call(self, method: str, *args: Any) -> Any:
        """Call a balancer method: a Ray actor's gives an awaitable ref, a plain instance's its result."""
        if self._load_balancer is None:
            raise RuntimeError(
                f"{type(self).__name__}: no load balancer; get a client from LLMServerManager.get_client() or pass "
                "load_balancer_handle"
            )
        bound = getattr(self._load_balancer, method)
        return bound.remote(*args) if hasattr(bound, "remote") else bound(*args)

    async def _acquire_server(self, request_id: str) -> tuple[str, Any]:
        result = self._balancer_call("acquire_server", request_id)
        return (await result) if hasattr(result, "__await__") else result

    def _release_server(self, server_id: str) -> None:
        self._balancer_call("release_server", server_id)  # a Ray actor's: fire and forget, calls stay in order

    def server_handles(self) -> list[Any]:
        """The handles of the servers registered in the balancer now (a blocking call: not from an event loop)."""
        result = self._balancer_call("get_server_handles")
        if hasattr(result, "__await__"):
            import ray

            result = ray.get(result)
        return list(result.values())

    # ------------------------------------------------------------------ generation
    def _next_turn(self, request_id: str) -> int:
        turn = self._turns.pop(request_id, 0)
        self._turns[request_id] = turn + 1
        while len(self._turns) > self._max_cache_size:
            self._turns.popitem(last=False)
        return turn

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """One turn of conversation ``request_id`` on its server; returns the server's ``TokenOutput`` with
        ``min_global_steps`` / ``max_global_steps`` in its ``extra_fields``. ``priority`` (veRL forwards it to vLLM
        only) is dropped: our engines serve first come, first served."""
        kwargs.pop("priority", None)
        if kwargs:
            raise TypeError(f"generate({request_id!r}): unexpected arguments {sorted(kwargs)}")
        if audio_data is not None or mm_processor_kwargs:
            raise NotImplementedError(
                f"generate({request_id!r}): audio_data / mm_processor_kwargs are not supported: our rollout engines "
                "take token ids (and images / videos where the engine supports them)"
            )
        from verl.workers.rollout.request import sample_seed

        prompt_ids = as_token_ids(prompt_ids, f"generate({request_id!r}): prompt_ids")
        turn = self._next_turn(request_id)
        params = dict(sampling_params or {})
        if turn and params.get("seed") is not None:  # a later turn samples from a stream of its own
            params["seed"] = sample_seed(int(params["seed"]), turn, 0, 0)
        server_side_id = f"{request_id}/{turn}"
        server_id, server = await self._acquire_server(request_id)
        self._in_flight[request_id] = (server_id, server, server_side_id)
        try:
            output = await server.generate.remote(
                server_side_id,
                prompt_ids=prompt_ids,
                sampling_params=params,
                image_data=image_data,
                video_data=video_data,
            )
        finally:
            self._release_server(server_id)
            if self._in_flight.get(request_id, (None, None, None))[2] == server_side_id:
                del self._in_flight[request_id]
        _fill_global_steps(output)
        return output

    async def abort(self, request_ids: Iterable[str] | None = None) -> dict[str, TokenOutput]:
        """Abort conversations this client has in flight (None: all of them); returns each one's partial output,
        which is also what its ``generate`` returns (``stop_reason="aborted"``)."""
        wanted = list(self._in_flight) if request_ids is None else [r for r in request_ids if r in self._in_flight]
        by_server: dict[str, tuple[Any, dict[str, str]]] = {}
        for conversation in wanted:
            server_id, handle, server_side_id = self._in_flight[conversation]
            by_server.setdefault(server_id, (handle, {}))[1][server_side_id] = conversation
        results = await asyncio.gather(*(handle.abort_requests.remote(list(ids)) for handle, ids in by_server.values()))
        out: dict[str, TokenOutput] = {}
        for (_, ids), partial in zip(by_server.values(), results):
            out.update({ids[server_side_id]: output for server_side_id, output in partial.items()})
        return out


def _fill_global_steps(output: TokenOutput) -> None:
    """``min_global_steps`` / ``max_global_steps``: the oldest / newest weight version among the tokens (the
    server's ``global_steps`` when it reports no per-token versions or generated nothing); set ones are kept."""
    versions = list(output.weight_versions) or [output.extra_fields.get("global_steps")]
    known = [v for v in versions if v is not None]
    output.extra_fields.setdefault("min_global_steps", min(known) if known else None)
    output.extra_fields.setdefault("max_global_steps", max(known) if known else None)


class FullyAsyncLLMServerClient(LLMServerClient):
    """An :class:`LLMServerClient` that hides aborts from the agent loop: an output that comes back aborted is sent
    again — prompt plus the tokens so far, for the rest of the ``max_tokens`` budget (``rollout.response_length``
    when the caller set none) — and the pieces are merged: tokens, log-probs, per-token versions, routing,
    preemptions. ``min_global_steps`` / ``max_global_steps`` then span every piece.

    It retries unless the config says ``async_training.partial_rollout=false`` (veRL's rule; our trainer config
    carries that key, false by default, so under it an aborted request comes back aborted). Our engines already
    keep a request's tokens across a weight push (they preempt it and recompute its KV under the new weights), so a
    request is only aborted here by an explicit abort (``CheckpointEngineManager.abort_replicas``, a replica's
    ``abort_all_requests``); the retry then continues it as a new request (its random stream restarts from a fresh
    per-turn seed).

    Args:
        config / load_balancer_handle / max_cache_size: as :class:`LLMServerClient`.
        only_hybrid: while the balancer has no server (hybrid servers being swapped), wait and ask again instead of
            failing.
    """

    retry_delay_s = 1.0  # between an abort and its retry (veRL: 1 s, the time its servers take to resume)

    def __init__(
        self,
        config: Any,
        load_balancer_handle: Any = None,
        only_hybrid: bool = False,
        max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE,
    ) -> None:
        super().__init__(config, load_balancer_handle, max_cache_size)
        self._only_hybrid = bool(only_hybrid)

    async def _acquire_server(self, request_id: str) -> tuple[str, Any]:
        while True:
            try:
                return await super()._acquire_server(request_id)
            except Exception as e:  # a Ray actor raises it wrapped: match the message
                if not self._only_hybrid or NO_SERVERS not in str(e):
                    raise
            await asyncio.sleep(self.retry_delay_s)

    def _retries(self) -> bool:
        async_training = _config_get(self.config, "async_training")
        return async_training is None or bool(_config_get(async_training, "partial_rollout", True))

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
        audio_data: Any = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """:meth:`LLMServerClient.generate`, resent while it comes back aborted (see the class docstring)."""
        prompt_ids = as_token_ids(prompt_ids, f"generate({request_id!r}): prompt_ids")
        params = dict(sampling_params or {})  # the budget changes per attempt: never the caller's dict
        key = next((k for k in ("max_tokens", "max_new_tokens") if params.get(k) is not None), None)
        budget = params.get(key) if key else None
        if budget is None:  # the server's default counts the tokens so far as prompt: pin the budget here
            length = _config_get(_rollout_section(self.config), "response_length")
            if isinstance(length, int) and length > 0:
                key, budget = "max_tokens", length
                params[key] = budget
        merged = TokenOutput(token_ids=[], log_probs=[], num_preempted=0)
        versions_known = True
        first_steps = last_steps = None
        while True:
            output = await super().generate(
                request_id,
                prompt_ids=prompt_ids + merged.token_ids,
                sampling_params=params,
                image_data=image_data,
                video_data=video_data,
                audio_data=audio_data,
                mm_processor_kwargs=mm_processor_kwargs,
                **kwargs,
            )
            _merge(merged, output)
            versions_known = versions_known and len(output.weight_versions) == len(output.token_ids)
            steps = output.extra_fields.get("global_steps")
            first_steps = steps if first_steps is None else first_steps
            last_steps = steps
            merged.extra_fields.update({k: v for k, v in output.extra_fields.items() if "global_steps" not in k})
            if budget is not None:
                params[key] = budget - len(merged.token_ids)
                if params[key] <= 0:  # the budget is spent: done, whatever the last piece's own reason
                    if merged.stop_reason in ("aborted", "abort"):
                        merged.stop_reason = "completed"
                    merged.extra_fields["finish_reason"] = "length"
                    break
            if output.stop_reason not in ("aborted", "abort") or not self._retries():
                break
            await asyncio.sleep(self.retry_delay_s)
        if not versions_known:
            merged.weight_versions = []
        versions = merged.weight_versions or [v for v in (first_steps, last_steps) if v is not None]
        merged.extra_fields["global_steps"] = last_steps
        merged.extra_fields["min_global_steps"] = min(versions) if versions else None
        merged.extra_fields["max_global_steps"] = max(versions) if versions else None
        return merged


def _merge(merged: TokenOutput, output: TokenOutput) -> None:
    """Append one attempt's output to the merged one."""
    merged.token_ids.extend(output.token_ids)
    if merged.log_probs is not None and output.log_probs is not None:
        merged.log_probs.extend(output.log_probs)
    else:
        merged.log_probs = None
    merged.weight_versions.extend(output.weight_versions)
    if output.routed_experts is not None and output.token_ids:
        import numpy as np

        new = output.routed_experts[-len(output.token_ids) :]
        merged.routed_experts = new if merged.routed_experts is None else np.concatenate([merged.routed_experts, new])
    merged.num_preempted = (merged.num_preempted or 0) + (output.num_preempted or 0)
    merged.stop_reason = output.stop_reason


# ---------------------------------------------------------------------------------------------- replicas
_KV_ONLY = (
    "our engines free the KV cache only together with the weights (sleep / wake_up), and a weight push needs no "
    "KV release: it preempts the running requests and recomputes their KV under the new weights"
)


class ServerReplica:
    """One of our rollout servers (rank ``worker_rank`` of ``worker_group``) as veRL's ``RolloutReplica``.

    Args:
        replica_rank: the replica's number (veRL's ``replica_rank``).
        worker_group: the worker group hosting the server (a fused group's role group works: its
            ``method_prefix`` is used).
        worker_rank: the server's rank in ``worker_group`` (default: ``replica_rank``).
        rollout_config: the ``actor_rollout_ref.rollout`` config; ``free_cache_engine=false`` makes :meth:`sleep` a
            no-op, as in veRL's servers.
    """

    def __init__(
        self, replica_rank: int, worker_group: Any, worker_rank: int | None = None, rollout_config: Any = None
    ) -> None:
        self.replica_rank = int(replica_rank)
        self.worker_group = worker_group
        self.worker_rank = self.replica_rank if worker_rank is None else int(worker_rank)
        if not 0 <= self.worker_rank < len(worker_group.workers):
            raise ValueError(
                f"ServerReplica: worker_rank={self.worker_rank} but worker group "
                f"{getattr(worker_group, 'name_prefix', '?')!r} has {len(worker_group.workers)} worker(s)"
            )
        from verl.experimental.agent_loop.server_manager import ServerHandle

        self.workers = [worker_group.workers[self.worker_rank]]
        self.method_prefix = getattr(worker_group, "method_prefix", "")
        self.config = rollout_config
        group_name = getattr(worker_group, "name_prefix", "") or "rollout"
        self._server_address = f"{group_name}:{self.worker_rank}"
        self._server_handle = ServerHandle(self.workers[0], self.method_prefix, f"{group_name} rank {self.worker_rank}")

    @property
    def server_address(self) -> str:
        """A name for the server (ours has no HTTP endpoint): ``<worker group>:<rank>``."""
        return self._server_address

    @property
    def server_handle(self) -> Any:
        """The server's request API (``generate.remote``, ``abort_requests.remote``)."""
        return self._server_handle

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.workers[0], f"{self.method_prefix}{method}").remote(*args, **kwargs)

    async def sleep(self) -> None:
        """Free the engine's weights and KV cache (not with ``free_cache_engine=false``). The ranks of a hybrid
        group sleep together (each checks that no rank has requests in flight): sleep them all at once, as
        ``CheckpointEngineManager.sleep_replicas`` does."""
        if _config_get(self.config, "free_cache_engine", True):
            await self._call("sleep")

    async def wake_up(self) -> None:
        """Restore a sleeping engine's memory (memory only: weights that were freed come back with the next push)."""
        await self._call("wake_up")

    async def abort_all_requests(self) -> dict[str, Any]:
        """Abort every request in flight on this server; each one's ``generate`` returns its partial output.
        Returns ``aborted_count`` and ``request_ids``."""
        partial = await self._server_handle.abort_requests.remote(None)
        return {"aborted_count": len(partial), "request_ids": list(partial)}

    async def resume_generation(self) -> None:
        """Nothing to do: our engines never pause after an abort (new requests are admitted at once)."""

    async def release_kv_cache(self) -> None:
        raise NotImplementedError(f"ServerReplica.release_kv_cache: {_KV_ONLY}")

    async def resume_kv_cache(self) -> None:
        raise NotImplementedError(f"ServerReplica.resume_kv_cache: {_KV_ONLY}")

    async def clear_kv_cache(self) -> None:
        raise NotImplementedError(
            "ServerReplica.clear_kv_cache: our engines drop their prefix caches themselves at every weight load"
        )

    async def start_profile(self, **kwargs: Any) -> None:
        await self._call("start_profile", **kwargs)

    async def stop_profile(self) -> None:
        await self._call("stop_profile")

    def __repr__(self) -> str:
        return f"ServerReplica({self.replica_rank}, {self._server_address})"


# ---------------------------------------------------------------------------------------------- the manager
class LLMServerManager:
    """The rollout servers of a worker group as veRL's ``LLMServerManager``: one :class:`ServerReplica` per worker,
    one :class:`GlobalRequestLoadBalancer` (a Ray actor) shared by every client :meth:`get_client` hands out.

    Build it with ``LLMServerManager.create(config, worker_group=...)`` (callable from sync code, or awaited).

    Args:
        config: the trainer config.
        worker_group: the workers hosting the engines: the actor-rollout group of the hybrid engine, or a group of
            role ``rollout`` (our servers on a pool of their own, started by the trainer).
        rollout_resource_pool: veRL's pool for a standalone launch or TensorRT-LLM; not read (with a worker group
            veRL reads it only for TensorRT-LLM).
        start_rank: the first replica's ``replica_rank``.
        load_balancer_cls: a :class:`GlobalRequestLoadBalancer` subclass to route with (it then gets no
            ``full_determinism``, as in veRL).
    """

    def __init__(
        self,
        config: Any,
        worker_group: Any = None,
        rollout_resource_pool: Any = None,
        start_rank: int = 0,
        load_balancer_cls: type | None = None,
    ) -> None:
        if worker_group is None:
            raise NotImplementedError(
                "LLMServerManager(worker_group=None): launching standalone rollout servers here is not supported; "
                "pass the worker group hosting the engines (the actor-rollout group, or the rollout servers the "
                "trainer starts for trainer.mode=colocate_async / separate_async)"
            )
        if load_balancer_cls is not None and not (
            isinstance(load_balancer_cls, type) and issubclass(load_balancer_cls, GlobalRequestLoadBalancer)
        ):
            raise TypeError(f"load_balancer_cls={load_balancer_cls!r} must be a GlobalRequestLoadBalancer subclass")
        self.config = config
        self.rollout_config = _rollout_section(config)
        self.model_config = _config_get(_config_get(config, "actor_rollout_ref"), "model")
        self.worker_group = worker_group
        self.rollout_resource_pool = rollout_resource_pool
        self.start_rank = int(start_rank)
        self._load_balancer_cls = load_balancer_cls or GlobalRequestLoadBalancer
        self.rollout_replicas: list[ServerReplica] = []
        self.server_handles: list[Any] = []
        self.server_addresses: list[str] = []
        self.global_load_balancer: Any = None

    @classmethod
    @auto_await
    async def create(cls, *args: Any, **kwargs: Any) -> LLMServerManager:
        """Build the manager, its replicas and its balancer (``LLMServerManager.create(config, worker_group=wg)``)."""
        instance = cls(*args, **kwargs)
        await instance._initialize_llm_servers()
        await instance._init_global_load_balancer()
        return instance

    async def _initialize_llm_servers(self, start_rank: int | None = None) -> None:
        first = self.start_rank if start_rank is None else int(start_rank)
        self.rollout_replicas = [
            ServerReplica(first + rank, self.worker_group, rank, self.rollout_config)
            for rank in range(len(self.worker_group.workers))
        ]
        self.server_handles = [replica.server_handle for replica in self.rollout_replicas]
        self.server_addresses = [replica.server_address for replica in self.rollout_replicas]
        logger.info("LLMServerManager: %d replica(s): %s", len(self.rollout_replicas), self.server_addresses)

    async def _init_global_load_balancer(self) -> None:
        import ray

        kwargs: dict[str, Any] = {
            "servers": dict(zip(self.server_addresses, self.server_handles, strict=True)),
            "max_cache_size": DEFAULT_ROUTING_CACHE_SIZE,
        }
        if self._load_balancer_cls is GlobalRequestLoadBalancer:
            kwargs["full_determinism"] = bool(_config_get(self.rollout_config, "full_determinism", False))
        self.global_load_balancer = ray.remote(num_cpus=0)(self._load_balancer_cls).remote(**kwargs)

    def get_client(self, client_cls: type[LLMServerClient] | None = None, **kwargs: Any) -> LLMServerClient:
        """A client routing through this manager's balancer (``client_cls``: e.g. :class:`FullyAsyncLLMServerClient`;
        ``kwargs`` go to its constructor)."""
        client_cls = client_cls or LLMServerClient
        return client_cls(config=self.config, load_balancer_handle=self.global_load_balancer, **kwargs)

    def get_addresses(self) -> list[str]:
        """The replicas' names (ours are Ray actors, not HTTP servers)."""
        return list(self.server_addresses)

    def get_replicas(self) -> list[ServerReplica]:
        return list(self.rollout_replicas)

    @auto_await
    async def start_profile(self, **kwargs: Any) -> None:
        """Start the profiler on every replica's worker."""
        await asyncio.gather(*(replica.start_profile(**kwargs) for replica in self.rollout_replicas))

    @auto_await
    async def stop_profile(self) -> None:
        await asyncio.gather(*(replica.stop_profile() for replica in self.rollout_replicas))
