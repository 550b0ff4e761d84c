"""`GlobalRequestLoadBalancer`: veRL 0.10's request router over rollout servers (sticky by request id, else the
least-loaded server; a stable hash of the id with ``full_determinism``). A plain, torch-free class:
`verl.workers.rollout.llm_server.LLMServerManager` runs it as a Ray actor shared by every client."""

from __future__ import annotations

import collections
import hashlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["DEFAULT_ROUTING_CACHE_SIZE", "NO_SERVERS", "GlobalRequestLoadBalancer"]

logger = logging.getLogger(__name__)

DEFAULT_ROUTING_CACHE_SIZE = 10000
NO_SERVERS = "No available servers in load balancer"  # veRL's message: FullyAsyncLLMServerClient waits on it


def _stable_hash(text: str) -> int:
    """A hash of ``text`` that is the same in every process and run (Python's ``hash`` of a str is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8, person=b"verl-route").digest(), "little")


class GlobalRequestLoadBalancer:
    """Routes requests over servers: sticky by request id, else the least loaded (see the module docstring).

    Args:
        servers: server id → handle (anything with ``generate.remote(...)``, e.g. a ``ServerHandle``); may be empty
            (servers added later with :meth:`add_servers`).
        max_cache_size: request ids remembered for stickiness (least recently used ones are forgotten first).
        full_determinism: route a new request id by a stable hash of it over the servers, whatever their load, so a
            request lands on the same server in every run.
    """

    def __init__(
        self,
        servers: Mapping[str, Any],
        max_cache_size: int = DEFAULT_ROUTING_CACHE_SIZE,
        full_determinism: bool = False,
    ) -> None:
        if isinstance(max_cache_size, bool) or not isinstance(max_cache_size, int) or max_cache_size < 1:
            raise ValueError(f"GlobalRequestLoadBalancer: max_cache_size={max_cache_size!r} must be a positive int")
        self._servers: dict[str, Any] = dict(servers)
        self._inflight: dict[str, int] = {server_id: 0 for server_id in self._servers}
        self._sticky: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._max_cache_size = max_cache_size
        self._full_determinism = bool(full_determinism)

    def acquire_server(self, request_id: str) -> tuple[str, Any]:
        """``(server id, handle)`` for ``request_id``, counted in flight until :meth:`release_server`. A request id
        seen before goes to its server while that server is registered; a new one (or one whose server was removed)
        to the least loaded server."""
        server_id = self._sticky.get(request_id)
        if server_id is not None and server_id in self._servers:
            self._sticky.move_to_end(request_id)
        else:
            if not self._servers:
                raise RuntimeError(NO_SERVERS)
            ids = list(self._servers)
            if self._full_determinism:
                server_id = ids[_stable_hash(request_id) % len(ids)]
            else:
                server_id = min(ids, key=self._inflight.__getitem__)  # ties: the first registered
            self._sticky[request_id] = server_id
            self._sticky.move_to_end(request_id)
            while len(self._sticky) > self._max_cache_size:
                self._sticky.popitem(last=False)
        self._inflight[server_id] += 1
        return server_id, self._servers[server_id]

    def release_server(self, server_id: str) -> None:
        """One request on ``server_id`` finished (a removed server or a count at zero: nothing to do)."""
        if self._inflight.get(server_id, 0) > 0:
            self._inflight[server_id] -= 1

    def add_servers(self, servers: Mapping[str, Any]) -> None:
        """Register servers (id → handle); a server already registered keeps its count in flight."""
        for server_id, handle in servers.items():
            self._servers[server_id] = handle
            self._inflight.setdefault(server_id, 0)
        logger.info("load balancer: %d server(s) added, %d registered", len(servers), len(self._servers))

    def remove_servers(self, server_ids: Iterable[str]) -> None:
        """Unregister servers; request ids pinned to them go to another server on their next turn."""
        server_ids = list(server_ids)
        for server_id in server_ids:
            self._servers.pop(server_id, None)
            self._inflight.pop(server_id, None)
        logger.info("load balancer: %d server(s) removed, %d registered", len(server_ids), len(self._servers))

    def clear_sticky_cache(self) -> dict[str, Any]:
        """Forget every request id's server (new turns go to the least loaded); returns ``cleared_entries`` and
        ``server_loads`` (requests in flight per server)."""
        cleared = len(self._sticky)
        self._sticky.clear()
        return {"cleared_entries": cleared, "server_loads": dict(self._inflight)}

    def get_inflight_count(self, server_id: str) -> int:
        return self._inflight.get(server_id, 0)

    def get_all_servers(self) -> list[str]:
        return list(self._servers)

    def get_total_inflight(self) -> int:
        return sum(self._inflight.values())

    def get_status(self) -> dict[str, Any]:
        return {
            "servers": dict(self._inflight),
            "total_inflight": self.get_total_inflight(),
            "active_servers": len(self._servers),
            "registered_handles": list(self._servers),
        }

    def get_server_handles(self) -> dict[str, Any]:
        """Server id → handle of every registered server (ours: the agent-loop manager places its workers by them)."""
        return dict(self._servers)


# ---------------------------------------------------------------------------------------------- clients
