"""Both ends of the weight push between a training worker and a rollout server in another process of its node.

In ``trainer.mode=colocate_async`` the rollout engines are *resident servers*: workers of role ``rollout`` that
share each placement-group bundle with a training worker (role ``actor`` / ``actor_ref``) and keep their weights
and KV cache while the trainer updates. The training worker of rank r pushes to the server of rank r through the
``shm`` checkpoint engine (:mod:`verl.checkpoint_engine.shm`): it connects once
(:meth:`RemoteRolloutWeights.connect_rollout_server`), then every ``update_weights(version)`` writes the buckets
into the shared buffer and the server loads them (:meth:`RemoteRolloutWeights.weight_receiver`), verified by digest
when asked. The messages are direct Ray calls from worker to worker; nothing goes through the driver.
"""

from __future__ import annotations

import logging
from typing import Any

import ray

from verl.checkpoint_engine import get_checkpoint_engine
from verl.checkpoint_engine.base import _to_dtype
from verl.checkpoint_engine.shm import ShmRolloutClient, ShmWeightReceiver, buffer_bytes
from verl.single_controller.base.decorator import Dispatch, register

__all__ = ["RemoteRolloutWeights"]

logger = logging.getLogger(__name__)

RECEIVER_OPS = ("begin", "load", "end", "weight_digests")


class RemoteRolloutWeights:
    """Mixin of :class:`~verl.workers.fsdp_workers.ActorRolloutRefWorker`: the training side connects to a rollout
    server, the server side receives (see the module docstring)."""

    _remote_rollout: ShmRolloutClient | None = None
    _weight_receiver: ShmWeightReceiver | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def connect_rollout_server(self, servers: list[Any], method_prefix: str = "") -> int:
        """Training side: push this rank's weights, from now on, to the rollout server ``servers[rank]`` (Ray actor
        handles of a worker group of role ``rollout``, one per training rank, on the same node) through a shared
        buffer of this process's making; returns the buffer's size in bytes."""
        if not self._is_actor or self._is_rollout:
            raise RuntimeError(
                f"connect_rollout_server on a worker of role {self.role!r}: only a training worker without a rollout "
                "engine of its own (role actor or actor_ref) pushes to a rollout server"
            )
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

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_receiver(self, op: str, *args: Any) -> Any:
        """Server side, called by the training worker that pushes to this one: ``open(path, nbytes)`` maps its
        shared buffer; ``begin(version)`` / ``load(slots)`` / ``end()`` / ``weight_digests()`` are those of
        :class:`~verl.checkpoint_engine.shm.ShmWeightReceiver`."""
        if not self._is_rollout or self._is_actor:
            raise RuntimeError(f"weight_receiver on a worker of role {self.role!r}: only a rollout server receives")
        if op == "open":
            if self._weight_receiver is not None:
                self._weight_receiver.close()
            self._weight_receiver = ShmWeightReceiver(self.rollout, *args)
            return None
        if op not in RECEIVER_OPS:
            raise ValueError(f"weight_receiver: unknown operation {op!r}; use open or one of {list(RECEIVER_OPS)}")
        if self._weight_receiver is None:
            raise RuntimeError(f"weight_receiver({op!r}) before open: no training worker is connected")
        return getattr(self._weight_receiver, op)(*args)

    def _weight_target(self) -> Any:
        """Where ``update_weights`` loads the actor's weights: the engine of this worker (hybrid) or the connected
        rollout server."""
        if self._is_rollout:
            return self.rollout
        if self._remote_rollout is None:
            raise RuntimeError(
                f"update_weights on rank {self.rank} (role {self.role!r}): no rollout engine in this worker and no "
                "rollout server connected (connect_rollout_server)"
            )
        return self._remote_rollout
