"""The driver's handles on generation and weight sync, at veRL's names, over the actor-rollout worker group.

- ``trainer.async_rollout_manager`` is an :class:`~verl.experimental.agent_loop.AgentLoopManager` (or the class
  ``rollout.agent.agent_loop_manager_class`` names): the trainer's one generation path — training, ReMax's greedy
  baseline, validation, and recipes' ``actor_rollout_wg.generate_sequences(batch)`` (routed to it by
  :func:`route_generation`: one response per row, as veRL's, whose callers repeat the prompts ``rollout.n``
  times first) all generate through the agent loops. The workers have no batch generation of their own: their
  engines serve requests (``generate``), which the agent loops send.
- :class:`CheckpointManager` is ``trainer.checkpoint_manager``: ``update_weights()`` pushes the actor's weights
  into the rollout engines as the next weight version (and returns the sync's metrics), ``sleep_replicas()`` frees
  the engines' memory until the next push.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

__all__ = ["CheckpointManager", "create_rollout_manager", "route_generation", "start_rollout_servers"]

logger = logging.getLogger(__name__)


def create_rollout_manager(
    config: Any,
    worker_group: Any,
    *,
    tokenizer: Any,
    reward_fn: Any = None,
    val_reward_fn: Any = None,
    step: Callable[[], int],
    teacher_client: Any = None,
) -> Any:
    """The trainer's ``async_rollout_manager`` over the worker group whose engines serve the requests (the
    actor-rollout group, or the rollout servers' group).

    ``rollout.agent.agent_loop_manager_class`` (a dotted path) replaces our manager; a class that is not an
    ``AgentLoopManager`` subclass gets veRL's arguments only (``config, worker_group``). ``teacher_client``:
    on-policy distillation's teachers (one client per key), for the agent loops to ask.
    """
    from verl.experimental.agent_loop import AgentLoopManager

    cls: Any = AgentLoopManager
    dotted = config.actor_rollout_ref.rollout.agent.get("agent_loop_manager_class")
    if dotted:
        module, _, name = str(dotted).rpartition(".")
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as e:
            raise ImportError(f"rollout.agent.agent_loop_manager_class={dotted!r} cannot be imported: {e}") from e
        logger.info("generation through the agent-loop manager %s", dotted)
    if isinstance(cls, type) and issubclass(cls, AgentLoopManager):
        teachers = {} if teacher_client is None else {"teacher_client": teacher_client}
        manager = cls(
            config,
            worker_group,
            tokenizer=tokenizer,
            reward_fn=reward_fn,
            val_reward_fn=val_reward_fn,
            step=step,
            **teachers,
        )
    else:
        if teacher_client is not None:
            raise ValueError(
                f"rollout.agent.agent_loop_manager_class={dotted!r} is not an AgentLoopManager: it cannot be given "
                "the distillation teachers (distillation.enabled)"
            )
        manager = cls(config, worker_group=worker_group)
    return manager


def route_generation(manager: Any, worker_groups: Any) -> None:
    """Make ``group.generate_sequences(batch)`` of each of ``worker_groups`` (the calls recipes written for veRL
    make on ``actor_rollout_wg``) the manager's: one response per input row, as veRL's (callers repeat a prompt
    batch ``rollout.n`` times first, ``gen_batch.repeat(repeat_times=n, interleave=True)``). The one place a
    worker group's generation is set; a manager class of a recipe's own that is not an ``AgentLoopManager`` leaves
    the groups untouched."""
    from verl.experimental.agent_loop import AgentLoopManager

    if isinstance(manager, AgentLoopManager):
        for group in worker_groups:
            group.generate_sequences = manager.generate_sequences


def _server_group(pool: Any, server_cls: Any, config: Any) -> Any:
    """A worker group of role ``rollout`` on ``pool`` (each server in a process of its own, its engine built from
    the model path): ``server_cls``, default :class:`~verl.workers.rollout_worker.RolloutServerWorker`."""
    from verl.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
    from verl.single_controller.ray.colocated import remote_worker_class
    from verl.workers.rollout_worker import RolloutServerWorker

    server_cls = server_cls or RolloutServerWorker
    cls = remote_worker_class(getattr(server_cls, "__ray_actor_class__", server_cls))
    servers = RayWorkerGroup(
        pool,
        RayClassWithInitArgs(cls, config=config.actor_rollout_ref, role="rollout"),
        name_prefix=f"{pool.name_prefix}_rollout_",
    )
    servers.init_model()
    return servers


def _start_separate_servers(pool: Any, server_cls: Any, config: Any, actor_wg: Any) -> Any:
    """Rollout servers on a pool of their own (``trainer.mode=separate_async``): a worker group of role ``rollout``
    on ``pool``, joined with the training workers in the weight push's process group (training rank 0 hosts it and
    broadcasts; the servers stage what they receive). The caller pushes the actor's weights before they generate."""
    import ray

    servers = _server_group(pool, server_cls, config)
    engine = config.actor_rollout_ref.rollout.checkpoint_engine
    host, port = actor_wg.weight_group_address()[0]
    world = 1 + servers.world_size
    joins = servers.execute_all_async("join_weight_group", host, port, world, engine.backend)
    actor_wg.connect_weight_group(host, port, world)
    ray.get(joins)
    logger.info("%d rollout server(s) on their own pool, weights pushed over %s", servers.world_size, engine.backend)
    return servers


def start_rollout_servers(pool: Any, config: Any, actor_wg: Any, separate: bool = False, server_cls: Any = None) -> Any:
    """Resident rollout servers beside the training workers: a worker group of role ``rollout`` (``server_cls``,
    default :class:`~verl.workers.rollout_worker.RolloutServerWorker`) on the bundles of
    ``pool`` (one server per training rank, each in a process of its own, its engine built from the model path),
    each connected to the training worker of its rank for the weight push (``actor_wg.connect_rollout_server``);
    with ``separate``, on a pool of their own (see :func:`_start_separate_servers`). The caller pushes the actor's
    weights before the servers generate."""
    if separate:
        return _start_separate_servers(pool, server_cls, config, actor_wg)
    servers = _server_group(pool, server_cls, config)
    nbytes = actor_wg.connect_rollout_server(servers.workers, getattr(servers, "method_prefix", ""))
    logger.info("%d rollout server(s) beside the training workers, %s shared bytes each", len(nbytes), nbytes[0])
    return servers


class CheckpointManager:
    """The weight push between the actor and the rollout engines of the hybrid engine (veRL's checkpoint manager).

    Every push is one new weight version: ``state.weight_version`` (the trainer's
    :class:`~verl.trainer.ppo.trainer_state.TrainerState`) goes +1 and the engines carry the new number, so each
    sample records the version that generated it. Pushing is its own call: generation never syncs weights.

    Args:
        worker_group: the actor-rollout worker group.
        state: the trainer state whose ``weight_version`` counts the pushes.
        free_cache_engine: whether :meth:`sleep_replicas` frees the engines' memory (``rollout.free_cache_engine``).
        receivers: rollout servers on a pool of their own (``trainer.mode=separate_async``): each push is staged in
            them (their ``receive_weights`` runs while the actor broadcasts); they load it when told to.
        sleeps_with: what shares the engines' memory and sleeps with them, woken after each push (a served reward
            model beside the training workers: its ``sleep()`` / ``wake_up()``).
    """

    def __init__(
        self,
        worker_group: Any,
        state: Any,
        free_cache_engine: bool = True,
        receivers: Any = None,
        sleeps_with: Any = None,
    ) -> None:
        self.worker_group = worker_group
        self.state = state
        self.free_cache_engine = bool(free_cache_engine)
        self.receivers = receivers
        self.sleeps_with = sleeps_with
        self._companion_asleep = False

    def update_weights(self, global_steps: int | None = None) -> dict[str, float]:
        """Push the actor's current weights into every rollout engine as version ``state.weight_version + 1``
        (waking the engines' memory to load them); returns the sync's metrics (reduced). ``global_steps`` is veRL's
        argument (veRL names a version after the step); here versions count pushes and it is not read."""
        version = self.state.weight_version + 1
        metrics = self._send(version)
        self.state.weight_version = version
        if self._companion_asleep:
            self.sleeps_with.wake_up()
            self._companion_asleep = False
        return metrics

    def resync_weights(self) -> dict[str, float]:
        """Send the actor's weights again under the current version (after a checkpoint restored both)."""
        return self._send(self.state.weight_version)

    def sleep_replicas(self) -> None:
        """Free the rollout engines' memory until the next push (when ``rollout.free_cache_engine``)."""
        if self.free_cache_engine:
            self.worker_group.sleep()
            if self.sleeps_with is not None and not self._companion_asleep:
                self.sleeps_with.sleep()
                self._companion_asleep = True

    def _send(self, version: int) -> dict[str, float]:
        from verl.checkpoint_engine.manager import push_weights  # the push, shared with CheckpointEngineManager

        return push_weights(self.worker_group, version, self.receivers)
