"""Where a run's workers live, and which of them died.

A worker process that dies (killed, crashed, out of memory, its node lost) is usually noticed first by another
process: a training worker whose weight push loses its peer, an agent-loop worker whose request fails. The error
that reaches the driver then names the wrong process. :func:`raise_if_workers_died` asks every worker of the run's
groups whether it is alive and, when some are not, raises a :class:`~verl.single_controller.ray.base.WorkerDiedError`
naming each dead worker's role, rank and node, chained to the error first seen.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import ray
from ray.exceptions import RayActorError

from verl.single_controller.ray.base import WorkerDiedError

__all__ = ["dead_workers", "describe_node", "placement", "raise_if_workers_died"]

logger = logging.getLogger(__name__)


def _addresses() -> dict[str, str]:
    try:
        return {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    except Exception:  # noqa: BLE001 — a report must not fail for want of an address
        return {}


def describe_node(node_id: str, addresses: Mapping[str, str] | None = None) -> str:
    """``node <ip> (id <first 12 hex digits>)``."""
    address = (addresses if addresses is not None else _addresses()).get(node_id, "?")
    return f"node {address} (id {node_id[:12]})"


def _workers(groups: Mapping[str, Any]) -> list[tuple[str, int, Any, str | None]]:
    """``(role, rank, actor, node id)`` of every worker of ``groups`` (role → worker group; None groups skipped; an
    actor shared by several roles is listed under the first)."""
    seen, out = set(), []
    for role, group in groups.items():
        if group is None:
            continue
        nodes = list(getattr(group, "_worker_nodes", []))
        for rank, actor in enumerate(group.workers):
            key = actor._actor_id.hex()
            if key in seen:
                continue
            seen.add(key)
            out.append((role, rank, actor, nodes[rank] if rank < len(nodes) else None))
    return out


def _pid(actor: Any) -> int:
    import os

    return os.getpid()


def placement(groups: Mapping[str, Any]) -> list[str]:
    """One ``role <r> rank <i>: node <ip> (id …), pid <p>`` line per worker of ``groups``."""
    addresses = _addresses()
    workers = _workers(groups)
    pids = ray.get([actor.__ray_call__.remote(_pid) for _, _, actor, _ in workers])
    return [
        f"role {role} rank {rank}: {describe_node(node, addresses) if node else 'node unknown'}, pid {pid}"
        for (role, rank, _, node), pid in zip(workers, pids, strict=True)
    ]


def _alive(actor: Any) -> None:
    return None


def dead_workers(groups: Mapping[str, Any], timeout_s: float = 5.0) -> list[str]:
    """The workers of ``groups`` that are dead, each as ``role <r> rank <i> (<node>)``. A worker that does not answer
    within ``timeout_s`` (busy) counts as alive: a dead actor's call fails at once."""
    workers = _workers(groups)
    refs = [actor.__ray_call__.remote(_alive) for _, _, actor, _ in workers]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    ready_set = set(ready)
    addresses = _addresses()
    dead = []
    for (role, rank, _, node), ref in zip(workers, refs, strict=True):
        if ref not in ready_set:
            continue
        try:
            ray.get(ref)
        except RayActorError:
            where = describe_node(node, addresses) if node else "node unknown"
            dead.append(f"role {role} rank {rank} on {where}")
    return dead


def raise_if_workers_died(groups: Mapping[str, Any], error: BaseException) -> None:
    """Raise a :class:`WorkerDiedError` naming every dead worker of ``groups``, chained to ``error`` (what the run
    saw first), when there are any; return otherwise."""
    try:
        dead = dead_workers(groups)
    except Exception as probe:  # noqa: BLE001 — the original error stays the one raised
        logger.warning("could not check which workers are alive: %r", probe)
        return
    if dead:
        raise WorkerDiedError(
            f"worker process(es) died: {'; '.join(dead)}. The run stops; restart it with "
            f"trainer.resume_mode=auto to go on from the last checkpoint. (First seen as: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''})"
        ) from error
