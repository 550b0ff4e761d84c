"""`AsyncLLMServerManager`: routes an agent loop's requests to the rollout replicas (veRL's name and signature).

- **Least outstanding requests**: a new conversation (a ``request_id`` not seen before) goes to the replica with the
  fewest requests in flight from this manager (ties: the lowest replica index, so routing is reproducible).
- **Sticky conversations**: later turns of a conversation (same ``request_id``) go to the same replica, so its
  prefix cache is reused; the mapping is an LRU of ``max_cache_size`` conversations.
- **Per-turn server ids**: each turn is sent under its own id (``<request_id>/<turn>``), so a replica never sees
  two requests with one id; :meth:`abort` maps a conversation to its turn in flight.
- **Seeds per turn**: a seeded conversation keeps its ``seed`` for turn 0 and derives a fresh one for each later
  turn (same conversation, same turns → same tokens).
- **Waves**: requests issued inside :meth:`AsyncLLMServerManager.wave` (the agent-loop worker opens one around
  the start of a batch, so every loop's first request is in it) go to each replica in one call,
  ``generate_wave(requests)``, which submits them together, in the order the loops asked — the same engine batch
  on every run, whatever the timing — and streams each output back as it finishes (a Ray streaming generator: one
  call instead of one per request).
- **Replicas come and go** (:meth:`AsyncLLMServerManager.add_servers` / :meth:`~AsyncLLMServerManager.remove_servers`,
  veRL's load-balancer calls, used to lend the training workers' engines to generation): a removed replica gets no
  new request (a conversation pinned to it goes on elsewhere at its next turn, its turn count and so its seeds
  kept); what it is serving finishes there (:meth:`~AsyncLLMServerManager.in_flight_on`). ``served`` counts the
  requests each replica was sent.
- **Weight versions per sample**: each sample's agent loop gets the manager wrapped in a :class:`SampleClient`,
  which records the weight version of every token the sample's ``generate`` calls return, in order, whatever the
  agent loop does with the outputs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from verl.utils.rollout_trace import rollout_trace_op
from verl.workers.rollout.replica import TokenOutput
from verl.workers.rollout.request import as_token_ids, sample_seed

__all__ = ["AsyncLLMServerManager", "SampleClient", "ServerHandle", "token_versions"]


def token_versions(output: TokenOutput) -> list[int]:
    """The weight version of each of ``output``'s tokens (an engine that reports no per-token versions: its
    ``global_steps`` for every token; none known: ``[]``)."""
    versions = list(output.weight_versions)
    if len(versions) != len(output.token_ids):
        last = output.extra_fields.get("global_steps")
        versions = [] if last is None else [int(last)] * len(output.token_ids)
    return versions


class SampleClient:
    """The server client one sample's agent loop is given: ``client`` (the worker's
    :class:`AsyncLLMServerManager` or a veRL-style client) with every ``generate`` output's token versions recorded
    in :attr:`token_versions`, in the order the outputs came, whatever the agent loop does with them. Everything
    else is ``client``'s."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.token_versions: list[int] = []

    async def generate(self, request_id: str, **kwargs: Any) -> TokenOutput:
        """``client.generate``, its output's token versions recorded."""
        output = await self.client.generate(request_id, **kwargs)
        self.token_versions.extend(token_versions(output))
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def _handle_key(handle: Any) -> Any:
    """What identifies a replica's handle, also across processes (a Ray actor's id)."""
    actor = getattr(handle, "actor", handle)
    actor_id = getattr(actor, "_actor_id", None)
    return (actor_id, getattr(handle, "prefix", "")) if actor_id is not None else id(handle)


class ServerHandle:
    """A rollout replica as a server: ``generate`` / ``abort_requests`` of the worker actor that hosts it.

    Args:
        actor: the Ray actor handle of the worker (a fused worker names its methods ``<role>_<method>``).
        prefix: that ``<role>_`` prefix ("" for a plain worker).
        name: how errors name the replica (e.g. ``actor_rollout rank 0``).
    """

    def __init__(self, actor: Any, prefix: str = "", name: str = "replica") -> None:
        self.actor = actor
        self.prefix = prefix
        self.name = name

    @property
    def generate(self) -> Any:
        """The actor method: ``await handle.generate.remote(request_id, prompt_ids=..., sampling_params=...)``."""
        return getattr(self.actor, f"{self.prefix}generate")

    @property
    def generate_wave(self) -> Any:
        """The actor method streaming ``(index, TokenOutput)`` for a list of requests submitted together."""
        return getattr(self.actor, f"{self.prefix}generate_wave")

    @property
    def abort_requests(self) -> Any:
        return getattr(self.actor, f"{self.prefix}abort_requests")

    def __repr__(self) -> str:
        return f"ServerHandle({self.name})"


class AsyncLLMServerManager:
    """Routes requests over the rollout replicas (see the module docstring).

    Args:
        config: the trainer config (kept for subclasses, as in veRL).
        server_handles: one handle per replica, each with ``generate.remote(...)`` (and ``abort_requests.remote``).
        max_cache_size: conversations remembered for stickiness.
    """

    def __init__(self, config: Any, server_handles: Sequence[Any], max_cache_size: int = 10000) -> None:
        if not server_handles:
            raise ValueError("AsyncLLMServerManager needs at least one rollout server")
        self.config = config
        self.server_handles = list(server_handles)
        self.max_cache_size = max_cache_size
        self.outstanding = [0] * len(self.server_handles)
        self.served = [0] * len(self.server_handles)  # requests sent to each replica
        self._removed: set[int] = set()  # replicas out of the routing (remove_servers)
        self._sticky: collections.OrderedDict[str, tuple[int, int]] = collections.OrderedDict()  # id → server, turns
        self._in_flight: dict[str, str] = {}  # conversation id → its server-side id in flight
        self._parked: list[tuple[int, dict[str, Any], asyncio.Future]] | None = None  # inside wave()
        self._streams: set[asyncio.Task] = set()

    @contextlib.contextmanager
    def wave(self) -> Iterator[None]:
        """Requests issued while this is open wait; on exit each replica's share is sent in one
        ``generate_wave`` call, in the order they were issued."""
        self._parked = []
        try:
            yield
        finally:
            parked, self._parked = self._parked, None
            by_server: dict[int, list[tuple[dict[str, Any], asyncio.Future]]] = collections.defaultdict(list)
            for server, request, future in parked:
                by_server[server].append((request, future))
            for server, items in by_server.items():
                task = asyncio.get_running_loop().create_task(self._stream_wave(server, items))
                self._streams.add(task)
                task.add_done_callback(self._streams.discard)

    async def _stream_wave(self, server: int, items: list[tuple[dict[str, Any], asyncio.Future]]) -> None:
        """One ``generate_wave`` call for a replica's share of a wave; each output resolves its request's future."""
        try:
            stream = (
                self.server_handles[server]
                .generate_wave.options(num_returns="streaming")
                .remote([request for request, _ in items])
            )
            async for ref in stream:
                index, output = await ref
                if not items[index][1].done():
                    items[index][1].set_result(output)
        except BaseException as error:  # the replica failed: every request of the wave hears of it
            for _, future in items:
                if not future.done():
                    future.set_exception(error)
            if not isinstance(error, Exception):
                raise
        for request, future in items:
            if not future.done():
                future.set_exception(RuntimeError(f"{request['request_id']}: the wave ended without its output"))

    def _choose_server(self, request_id: str) -> tuple[int, int]:
        """(replica index, turn number) for the next turn of conversation ``request_id``."""
        server, turns = self._sticky.pop(request_id, (None, 0))
        if server is None or server in self._removed:
            active = [i for i in range(len(self.outstanding)) if i not in self._removed]
            server = min(active, key=self.outstanding.__getitem__)
        self._sticky[request_id] = (server, turns + 1)
        while len(self._sticky) > self.max_cache_size:
            self._sticky.popitem(last=False)
        return server, turns

    @rollout_trace_op
    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: Any = None,
        video_data: Any = None,
    ) -> TokenOutput:
        """Generate one turn of conversation ``request_id`` on its replica; returns the replica's ``TokenOutput``."""
        prompt_ids = as_token_ids(prompt_ids, f"generate({request_id!r}): prompt_ids")
        server, turn = self._choose_server(request_id)
        params = dict(sampling_params or {})
        if turn and params.get("seed") is not None:
            params["seed"] = sample_seed(int(params["seed"]), turn, 0, 0)
        server_id = f"{request_id}/{turn}"
        self.outstanding[server] += 1
        self.served[server] += 1
        self._in_flight[request_id] = server_id
        try:
            handle = self.server_handles[server]
            text_only = image_data is None and video_data is None
            if self._parked is not None and text_only and hasattr(handle, "generate_wave"):
                future = asyncio.get_running_loop().create_future()  # sent with its wave
                request = {"request_id": server_id, "prompt_ids": prompt_ids, "sampling_params": params}
                self._parked.append((server, request, future))
                output = await future
            else:
                output = await handle.generate.remote(
                    server_id,
                    prompt_ids=prompt_ids,
                    sampling_params=params,
                    image_data=image_data,
                    video_data=video_data,
                )
            return output
        finally:
            self.outstanding[server] -= 1
            if self._in_flight.get(request_id) == server_id:
                del self._in_flight[request_id]

    # ------------------------------------------------------------------ replicas that come and go
    def _index(self, handle: Any) -> int | None:
        key = _handle_key(handle)
        return next((i for i, h in enumerate(self.server_handles) if _handle_key(h) == key), None)

    def add_servers(self, handles: Iterable[Any]) -> None:
        """Route new requests to ``handles`` too (a replica removed earlier comes back at its place)."""
        for handle in handles:
            index = self._index(handle)
            if index is None:
                self.server_handles.append(handle)
                self.outstanding.append(0)
                self.served.append(0)
            else:
                self._removed.discard(index)

    def remove_servers(self, handles: Iterable[Any]) -> None:
        """Route no new request to ``handles``; their requests in flight finish there."""
        indices = {i for i in map(self._index, handles) if i is not None}
        if len(self._removed | indices) == len(self.server_handles):
            raise ValueError("AsyncLLMServerManager.remove_servers: that would leave no replica to route to")
        self._removed |= indices

    def in_flight_on(self, handles: Iterable[Any]) -> int:
        """Requests this manager has in flight on ``handles``."""
        return sum(self.outstanding[i] for i in map(self._index, handles) if i is not None)

    def served_by(self, handles: Iterable[Any]) -> int:
        """Requests this manager sent to ``handles`` so far."""
        return sum(self.served[i] for i in map(self._index, handles) if i is not None)

    def server_of(self, request_id: str) -> int | None:
        """The replica a conversation is pinned to (None: unknown or evicted)."""
        entry = self._sticky.get(request_id)
        return None if entry is None else entry[0]

    async def abort(self, request_ids: Iterable[str] | None = None) -> dict[str, TokenOutput]:
        """Abort conversations in flight (None: every one this manager sent); returns each one's partial output."""
        wanted = list(self._in_flight) if request_ids is None else [r for r in request_ids if r in self._in_flight]
        by_server: dict[int, dict[str, str]] = collections.defaultdict(dict)
        for conversation in wanted:
            server = self.server_of(conversation)
            if server is not None:
                by_server[server][self._in_flight[conversation]] = conversation
        results = await asyncio.gather(
            *(self.server_handles[s].abort_requests.remote(list(ids)) for s, ids in by_server.items())
        )
        out: dict[str, TokenOutput] = {}
        for (_, ids), partial in zip(by_server.items(), results):
            out.update({ids[server_id]: output for server_id, output in partial.items()})
        return out
