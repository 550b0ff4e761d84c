"""The driver's side of the weight push: :func:`push_weights` and veRL 0.10's :class:`CheckpointEngineManager`.

:func:`push_weights` is the push itself: every training rank's ``update_weights(version)`` (the engine of each
hybrid worker, or the rollout server it is connected to, loads the actor's weights as that version), and, for
rollout servers on a pool of their own, their ``receive_weights`` at the same time (they stage the push). The
trainer's ``CheckpointManager`` and :class:`CheckpointEngineManager` both push through it.

:class:`CheckpointEngineManager` is veRL 0.10's constructor and calls over the same push:
``CheckpointEngineManager(config, actor_wg, replicas)`` with ``config`` the ``rollout.checkpoint_engine`` config
and ``replicas`` the :class:`~verl.workers.rollout.llm_server.ServerReplica` s of
``LLMServerManager.get_replicas()``; ``update_weights(global_steps)`` pushes the actor's weights as version
``global_steps`` (the engines' ``global_steps`` from then on) and returns the push's metrics (``weight_sync/*``,
averaged over the training ranks). Which transfer carries the push is the one the workers were built with; the
replicas decide what else happens:

- replicas in ``actor_wg`` (the hybrid engine; veRL's ``naive``): the push loads them, nothing else;
- servers connected to the training ranks (backend ``shm``, ``trainer.mode=colocate_async``): the same;
- servers on a pool of their own (backend ``gloo`` / ``nccl``, ``trainer.mode=separate_async``): they stage the push
  while it is sent, then load it (``apply_weights``).

Every method may be called from sync code or awaited (veRL's ``auto_await``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from verl.checkpoint_engine.base import CheckpointEngineRegistry
from verl.utils.import_utils import import_external_libs
from verl.utils.metric import reduce_metrics
from verl.utils.ray_utils import auto_await

__all__ = ["CheckpointEngineManager", "push_weights"]

logger = logging.getLogger(__name__)

STAGING_BACKENDS = ("gloo", "nccl")  # servers on a pool of their own: a push is staged, then loaded
CONNECTED_BACKENDS = ("shm", *STAGING_BACKENDS)  # backends that reach servers outside the training workers

_KV_ONLY = (
    "our engines free the KV cache only together with the weights (sleep_replicas / wake_up_replicas), and a push "
    "needs no KV release: it preempts the running requests and recomputes their KV under the new weights"
)


def push_weights(actor_wg: Any, version: int | None, receivers: Any = None) -> dict[str, float]:
    """Push the actor's current weights as weight version ``version`` (None: each engine's version + 1); returns
    the push's metrics, each averaged over the training ranks.

    Args:
        actor_wg: the training worker group (every rank's ``update_weights(version=...)`` takes part).
        version: the version the engines carry from now on.
        receivers: rollout servers on a pool of their own (a worker group): each stages the push (its
            ``receive_weights`` runs while the actor broadcasts) and must report ``version``.
    """
    if receivers is None:
        stats = actor_wg.update_weights(version=version)
    else:
        import ray

        received = receivers.execute_all_async("receive_weights")  # each server stages the push
        stats = actor_wg.update_weights(version=version, to="servers")  # a failure here ends the run
        versions = ray.get(received)
        if versions != [version] * len(versions):
            raise RuntimeError(f"weight push {version}: the rollout servers staged versions {versions}")
    return reduce_metrics({k: [s[k] for s in stats] for k in stats[0]}) if stats else {}


def _get(config: Any, key: str, default: Any = None) -> Any:
    if hasattr(config, "get"):
        return config.get(key, default)
    return getattr(config, key, default)


class CheckpointEngineManager:
    """veRL 0.10's weight-sync manager over our push (see the module docstring).

    Args:
        config: the ``actor_rollout_ref.rollout.checkpoint_engine`` config (mapping or dataclass): ``backend``
            (a registered name), and veRL's ``custom_backend_module`` (imported first, to register a backend).
        actor_wg: the training worker group whose weights are pushed.
        replicas: the rollout replicas (``LLMServerManager.get_replicas()``): each names its ``worker_group`` and
            ``worker_rank``.
    """

    def __init__(self, config: Any, actor_wg: Any, replicas: list[Any]) -> None:
        self.config = config
        self.backend = str(_get(config, "backend", "naive"))
        import_external_libs(_get(config, "custom_backend_module", None) or None)
        self.backend_cls = CheckpointEngineRegistry.get(self.backend)
        self.actor_wg = actor_wg
        self.replicas: list[Any] = []
        self.add_replicas(replicas)

    # ------------------------------------------------------------------ the replicas
    def _hybrid(self, replica: Any) -> bool:
        """Whether the replica's engine lives in a training worker of ``actor_wg``."""
        return replica.workers[0] in list(self.actor_wg.workers)

    def _check(self, replicas: list[Any]) -> None:
        for replica in replicas:
            missing = [a for a in ("worker_group", "worker_rank", "workers") if not hasattr(replica, a)]
            if missing:
                raise TypeError(
                    f"CheckpointEngineManager: replica {replica!r} has no {missing}; pass the replicas of "
                    "LLMServerManager.get_replicas() (verl.workers.rollout.llm_server.ServerReplica)"
                )
        outside = [r for r in replicas if not self._hybrid(r)]
        if outside and self.backend not in CONNECTED_BACKENDS:
            raise ValueError(
                f"CheckpointEngineManager: backend {self.backend!r} loads weights into the training workers' own "
                f"engines, but replicas {outside[:4]} are servers outside actor_wg; name the backend they were "
                f"connected with: 'shm' (servers beside the training workers) or 'gloo' / 'nccl' (servers on a pool "
                "of their own)"
            )
        groups = {id(r.worker_group) for r in [*self.replicas, *replicas] if not self._hybrid(r)}
        if self.backend in STAGING_BACKENDS and len(groups) > 1:
            raise NotImplementedError(
                f"CheckpointEngineManager: replicas from {len(groups)} server groups; a push over {self.backend!r} "
                "reaches the one group that joined the training ranks' process group"
            )

    def add_replicas(self, replicas: list[Any]) -> None:
        """Add replicas (veRL's elastic scale-up); the next push reaches them."""
        replicas = list(replicas)
        self._check(replicas)
        self.replicas.extend(replicas)

    def remove_replicas(self, replicas: list[Any]) -> None:
        """Drop replicas from the manager (they keep their engines; :meth:`sleep_replicas` then refuses a hybrid
        group that is no longer whole)."""
        gone = {id(r) for r in replicas}
        self.replicas = [r for r in self.replicas if id(r) not in gone]

    def _staging_group(self) -> Any:
        """The server group that stages pushes (servers on a pool of their own), or None."""
        if self.backend not in STAGING_BACKENDS:
            return None
        outside = [r for r in self.replicas if not self._hybrid(r)]
        return outside[0].worker_group if outside else None

    @auto_await
    async def sleep_replicas(self) -> None:
        """Free the hybrid engines' memory (weights and KV cache) until the next push, when
        ``rollout.free_cache_engine``. Servers outside ``actor_wg`` keep theirs (veRL's standalone servers too)."""
        hybrid = [r for r in self.replicas if self._hybrid(r)]
        if hybrid:
            ranks = {r.worker_rank for r in hybrid}
            everyone = set(range(len(self.actor_wg.workers)))
            if ranks != everyone:
                raise NotImplementedError(
                    f"sleep_replicas: the replicas cover ranks {sorted(ranks)} of the {len(everyone)} training "
                    "workers; the ranks of a hybrid group sleep together (each checks, with the others, that no rank "
                    "has requests in flight), so sleeping some would wait forever: add the others back first"
                )
        await asyncio.gather(*(r.sleep() for r in hybrid))

    @auto_await
    async def wake_up_replicas(self) -> None:
        """Restore the memory of sleeping engines (memory only: freed weights come back with the next push)."""
        await asyncio.gather(*(r.wake_up() for r in self.replicas))

    @auto_await
    async def abort_replicas(self) -> None:
        """Abort every request in flight on every replica (each ``generate`` returns its partial output)."""
        await asyncio.gather(*(r.abort_all_requests() for r in self.replicas))

    @auto_await
    async def resume_generation_replicas(self) -> None:
        """Nothing to resume: our engines never pause after an abort."""
        await asyncio.gather(*(r.resume_generation() for r in self.replicas))

    @auto_await
    async def release_kv_cache_replicas(self) -> None:
        raise NotImplementedError(f"release_kv_cache_replicas: {_KV_ONLY}")

    @auto_await
    async def resume_kv_cache_replicas(self) -> None:
        raise NotImplementedError(f"resume_kv_cache_replicas: {_KV_ONLY}")

    # ------------------------------------------------------------------ the push
    @auto_await
    async def update_weights(self, global_steps: int | None = None) -> dict[str, float]:
        """Push the actor's weights into every engine as version ``global_steps`` (None: each engine's version + 1);
        returns the push's metrics. Hybrid engines must be idle (no request in flight: finish or abort first);
        servers elsewhere go on generating and continue their running requests under the new weights."""
        if isinstance(global_steps, bool) or not (global_steps is None or isinstance(global_steps, int)):
            raise TypeError(f"update_weights: global_steps={global_steps!r} must be an int or None")
        receivers = self._staging_group()
        if receivers is not None and global_steps is None:
            raise ValueError(
                f"update_weights(): servers that stage pushes (backend {self.backend!r}) load them by version; pass "
                "global_steps"
            )
        metrics = await asyncio.to_thread(push_weights, self.actor_wg, global_steps, receivers)
        if receivers is not None:
            await asyncio.to_thread(receivers.apply_weights, global_steps)
        return metrics
