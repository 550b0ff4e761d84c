"""The sending end of the weight push from a training worker to rollout servers in other processes (the receiving
end is :class:`~verl.workers.rollout_worker.RolloutServerWorker`).

In ``trainer.mode=colocate_async`` the rollout engines are *resident servers*: workers of role ``rollout`` that
share each placement-group bundle with a training worker (role ``actor`` / ``actor_ref``) and keep their weights
and KV cache while the trainer updates. The training worker of rank r pushes to the server of rank r through the
``shm`` checkpoint engine (:mod:`verl.checkpoint_engine.shm`): it connects once
(:meth:`RemoteRolloutWeights.connect_rollout_server`), then every ``update_weights(version)`` writes the buckets
into the shared buffer and the server loads them (its ``weight_receiver``), verified by digest when asked. The
messages are direct Ray calls from worker to worker; nothing goes through the driver.

In ``trainer.mode=separate_async`` the servers are on a pool of their own, possibly other nodes: the training
workers and the servers join one process group for the push (:meth:`RemoteRolloutWeights.connect_weight_group`,
the servers' ``join_weight_group``; backend ``gloo`` or ``nccl``), training rank 0 broadcasts every push to all
servers, which *stage* it beside their engines (``receive_weights``) while they go on generating; the driver then
says which staged version each engine loads, and when (``apply_weights``). A training worker with an engine of its
own (role ``actor_rollout``: ``separate_async``'s hybrid switch lends it to generation) joins the group too; its
``update_weights(to=...)`` says which of the two a push reaches.
"""

from __future__ import annotations

import logging
from typing import Any

import ray

from verl.checkpoint_engine import get_checkpoint_engine
from verl.checkpoint_engine.base import _to_dtype
from verl.checkpoint_engine.collective import BroadcastSender, NotSending, weight_group
from verl.checkpoint_engine.shm import ShmRolloutClient, buffer_bytes
from verl.single_controller.base.decorator import Dispatch, register

__all__ = ["RemoteRolloutWeights"]

logger = logging.getLogger(__name__)


class RemoteRolloutWeights:
    """Mixin of :class:`~verl.workers.fsdp_workers.ActorRolloutRefWorker`: the training side of the push to rollout
    servers (see the module docstring)."""

    _remote_rollout: ShmRolloutClient | BroadcastSender | NotSending | None = None
    _servers_engine: Any = None  # a worker with an engine of its own: the checkpoint engine of its pushes to servers

    def _check_pusher(self, call: str, own_engine_allowed: bool = False) -> None:
        if not self._is_actor or (self._is_rollout and not own_engine_allowed):
            raise RuntimeError(
                f"{call} on a worker of role {self.role!r}: only a training worker without a rollout engine of its "
                "own (role actor or actor_ref) pushes to rollout servers"
                + ("" if own_engine_allowed else " through shared memory")
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def connect_rollout_server(self, servers: list[Any], method_prefix: str = "") -> int:
        """Training side: push this rank's weights, from now on, to the rollout server ``servers[rank]`` (Ray actor
        handles of a worker group of role ``rollout``, one per training rank, on the same node) through a shared
        buffer of this process's making; returns the buffer's size in bytes."""
        self._check_pusher("connect_rollout_server")
        if len(servers) != self.world_size:
            raise ValueError(f"connect_rollout_server: {len(servers)} rollout servers for {self.world_size} ranks")
        receive = getattr(servers[self.rank], f"{method_prefix}weight_receiver")

        def call(op: str, *args: Any) -> Any:
            return ray.get(receive.remote(op, *args))

        cfg = self.rollout_config
        self.checkpoint_engine = get_checkpoint_engine(cfg.checkpoint_engine, dtype=cfg.dtype)
        rollout_dtype = _to_dtype(cfg.dtype)
        sizes = [
            t.numel() * (rollout_dtype.itemsize if rollout_dtype and t.is_floating_point() else t.element_size())
            for t in self.actor_engine.module.state_dict().values()
        ]
        nbytes = buffer_bytes(sizes, self.checkpoint_engine.bucket_bytes)
        if self._remote_rollout is not None:
            self._remote_rollout.close()
        self._remote_rollout = ShmRolloutClient(call, nbytes)
        self._remote_rollout.connect()
        logger.info("rank %d pushes weights to its rollout server through %d shared bytes", self.rank, nbytes)
        return nbytes

    # ------------------------------------------------------------------ the push across pools
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_group_address(self) -> tuple[str, int]:
        """This worker's node address and a free port there (rank 0's hosts the weight group)."""
        from verl.utils.net_utils import node_ip_and_free_port

        return node_ip_and_free_port()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def connect_weight_group(self, host: str, port: int, world_size: int, timeout_s: float = 600.0) -> None:
        """Training side: join the push's process group of ``world_size`` (rank 0 of this worker group and every
        rollout server) hosted at ``host:port``; from now on rank 0 broadcasts each ``update_weights`` to the
        servers, the other ranks gather with it and send nothing. The servers join at the same time
        (:meth:`join_weight_group`)."""
        self._check_pusher("connect_weight_group", own_engine_allowed=True)
        cfg = self.rollout_config
        engine = get_checkpoint_engine(cfg.checkpoint_engine, dtype=cfg.dtype)
        if self._is_rollout:  # its own engine keeps the hybrid's checkpoint engine; the servers get this one
            self._servers_engine = engine
        else:
            self.checkpoint_engine = engine
        if self.rank == 0:
            backend = cfg.checkpoint_engine.backend
            group = weight_group(host, port, 0, world_size, backend, timeout_s)
            self._remote_rollout = BroadcastSender(group, device="cpu" if backend == "gloo" else "cuda")
        else:
            self._remote_rollout = NotSending()
        logger.info("rank %d joined the weight push to %d rollout server(s)", self.rank, world_size - 1)

    def _weight_target(self, to: str | None = None) -> Any:
        """Where ``update_weights`` loads the actor's weights: ``to="engine"``, the engine of this worker (hybrid);
        ``to="servers"``, the connected rollout server(s); None: the one this worker has (its engine when it has
        both)."""
        if to not in (None, "engine", "servers"):
            raise ValueError(f"update_weights(to={to!r}); use 'engine' or 'servers'")
        if to == "engine" or (to is None and self._is_rollout):
            if not self._is_rollout:
                raise RuntimeError(f"update_weights(to='engine') on a worker of role {self.role!r}: it has no engine")
            return self.rollout
        if self._remote_rollout is None:
            raise RuntimeError(
                f"update_weights on rank {self.rank} (role {self.role!r}): no rollout engine in this worker and no "
                "rollout server connected (connect_rollout_server)"
            )
        return self._remote_rollout
