"""`AgentLoopManager`: the driver's one generation path (veRL's ``trainer.async_rollout_manager``).

``generate_sequences(prompts)`` takes prompt rows already repeated ``n`` times (veRL's call pattern), fills what the
agent loops need and the caller may not have set (EOS / pad ids, the step, per-sample seeding indices), splits the
rows over the agent-loop workers, joins their batches and returns the batch with ``meta_info``: ``timing``
(``generate_sequences``: the wall time), ``metrics`` (``agent_loop/*`` and the per-sample rewards' ``reward/*``
counts) and ``reward_extra_keys``; each sample's ``weight_version_ranges`` say which version generated which of its
tokens, and its ``min_global_steps`` / ``max_global_steps`` (veRL 0.10's names) the oldest and the newest.
Generation uses the weights the engines hold: memory (``wake_up`` / ``sleep``) and the weight push are the
trainer's calls, never made here.

The replicas are the rollout engines inside the training workers (hybrid placement: one replica per worker, each a
server through the worker's :func:`~verl.single_controller.base.decorator.server_method` s), reached through an
``AsyncLLMServerManager`` per agent-loop worker; or, built with veRL 0.10's :meth:`AgentLoopManager.create` (config,
``llm_client``), whatever servers that client routes to (an
:class:`~verl.workers.rollout.llm_server.LLMServerClient` of ``LLMServerManager.get_client()``). The agent-loop
workers are Ray actors with ``num_cpus=0`` placed on their replica's node: ``rollout.agent.num_workers`` of them
(default: 8 with GPUs, one per node hosting replicas on a multi-node CPU cluster). With ``num_workers=0`` (the
default on a one-node cluster without GPUs) the agent loops run in this process instead, on an event loop of their
own (`InProcessAgentLoopWorker`): the same worker class and code, without a process that imports the stack again
(~5 s of CPU and ~450 MB per run on a laptop).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import threading
import time
from typing import Any

import ray
import torch
from ray.exceptions import RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from verl.experimental.agent_loop.postprocess import agent_loop_metrics
from verl.experimental.agent_loop.server_manager import ServerHandle
from verl.experimental.agent_loop.worker import AgentLoopWorker
from verl.protocol import DataProto
from verl.single_controller.ray.base import WorkerDiedError
from verl.utils.ray_utils import auto_await
from verl.workers.config.builders import build_rollout_config

__all__ = ["AgentLoopManager", "sample_indices"]

logger = logging.getLogger(__name__)

_GPU_DEFAULT_WORKERS = 8


def sample_indices(prompt_index: torch.Tensor) -> torch.Tensor:
    """Per row, how many earlier rows share its ``prompt_index`` (0, 1, … within each prompt's copies)."""
    out = torch.zeros_like(prompt_index)
    seen: dict[int, int] = {}
    for row, prompt in enumerate(prompt_index.tolist()):
        out[row] = seen.get(prompt, 0)
        seen[prompt] = out[row].item() + 1
    return out


def _split(data: DataProto, parts: int) -> list[DataProto]:
    """``parts`` contiguous pieces of near-equal size (empty ones dropped)."""
    size, extra = divmod(len(data), parts)
    pieces, start = [], 0
    for i in range(parts):
        stop = start + size + (1 if i < extra else 0)
        if stop > start:
            pieces.append(data.slice(start, stop))
        start = stop
    return pieces


def _node_id(actor: Any) -> str:
    return ray.get_runtime_context().get_node_id()


class InProcessAgentLoopWorker:
    """An agent-loop worker object (`AgentLoopWorkerBase` or a recipe's subclass) run in this process: its
    coroutines on an event loop of their own, in a daemon thread, so the caller may block on them (the trainer's
    thread, or an async mode's generation thread)."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agent-loops", daemon=True)
        self._thread.start()

    def generate_sequences(self, batch: DataProto) -> DataProto:
        """``worker.generate_sequences(batch)``, awaited on the agent loops' event loop."""
        return asyncio.run_coroutine_threadsafe(self.worker.generate_sequences(batch), self._loop).result()

    def routing(self, call: str, handles: list[Any]) -> Any:
        """``worker.routing(call, handles)`` on the agent loops' event loop."""
        return asyncio.run_coroutine_threadsafe(self.worker.routing(call, handles), self._loop).result()


class AgentLoopManager:
    """Generation through the agent loops (see the module docstring).

    Args:
        config: the trainer config (``actor_rollout_ref``, ``data``, ...).
        worker_group: the actor-rollout worker group whose engines serve the requests (hybrid placement).
        rollout_resource_pool / rm_resource_pool: veRL's arguments for standalone rollout / reward-model servers; not
            supported yet (giving one is an error).
        tokenizer: the policy's tokenizer (EOS and pad ids; loaded from the model path when not given).
        reward_fn / val_reward_fn: score each sample as it finishes (training / validation); None: not scored.
        step: returns the trainer's current step (it seeds sampling).
        llm_client: veRL 0.10's client the agent loops send their requests through (instead of one
            ``AsyncLLMServerManager`` per agent-loop worker over ``worker_group``'s engines); see :meth:`create`.
        teacher_client: on-policy distillation's teachers, one client per teacher key
            (`verl.experimental.teacher_loop`): each training sample gets its teacher's view as it finishes.
    """

    def __init__(
        self,
        config: Any,
        worker_group: Any = None,
        rollout_resource_pool: Any = None,
        rm_resource_pool: Any = None,
        *,
        tokenizer: Any = None,
        reward_fn: Any = None,
        val_reward_fn: Any = None,
        step: Any = None,
        llm_client: Any = None,
        teacher_client: Any = None,
    ) -> None:
        standalone = rollout_resource_pool is not None or rm_resource_pool is not None
        if standalone or (worker_group is None and llm_client is None):
            raise NotImplementedError(
                "AgentLoopManager: rollout servers on their own resource pool (standalone) are not supported yet; "
                "pass the actor-rollout worker group (hybrid placement) or an llm_client "
                "(LLMServerManager.create(config, worker_group=...).get_client())"
            )
        if tokenizer is None:
            from verl.utils.tokenizer import hf_tokenizer

            tokenizer = hf_tokenizer(config.actor_rollout_ref.model.path)
        self.config = config
        self.rollout_config = build_rollout_config(config.actor_rollout_ref.rollout)  # typed, defaults filled
        self.worker_group = worker_group
        self.tokenizer = tokenizer
        self.step = step or (lambda: 0)
        self.llm_client = llm_client
        self.teacher_client = teacher_client
        if teacher_client is not None:  # the keys checked against distillation.teacher_models now, not in a worker
            from verl.experimental.teacher_loop import AsyncTeacherLLMServerManager

            AsyncTeacherLLMServerManager(config, teacher_client)
        if llm_client is not None:  # its servers: where the agent-loop workers go, and whom to ask after a failure
            handles = getattr(llm_client, "server_handles", None)
            self.server_handles = list(handles()) if callable(handles) else []
        else:
            self.server_handles = self.replica_handles(worker_group)
        if not hasattr(self, "agent_loop_workers_class"):  # a recipe's subclass may set its own
            self.agent_loop_workers_class = AgentLoopWorker
        self._init_agent_loop_workers(reward_fn, val_reward_fn)

    @classmethod
    @auto_await
    async def create(
        cls,
        config: Any,
        llm_client: Any = None,
        teacher_client: Any = None,
        reward_loop_worker_handles: Any = None,
        **kwargs: Any,
    ) -> AgentLoopManager:
        """veRL 0.10's constructor: agent loops sending their requests through ``llm_client``
        (``LLMServerManager.create(config, worker_group=...).get_client()``). ``kwargs`` are ours (``tokenizer``,
        ``reward_fn``, ``val_reward_fn``, ``step``). Callable from sync code, or awaited."""
        if reward_loop_worker_handles is not None:
            raise NotImplementedError(
                "AgentLoopManager.create(reward_loop_worker_handles=...): veRL's reward-loop worker processes have no "
                "counterpart here; pass None and give reward_fn / val_reward_fn (verl.trainer.ppo.reward."
                "load_reward_manager(config, tokenizer): any reward-loop manager, a served reward model included): "
                "the agent loops score each sample with them as soon as it finishes"
            )
        if llm_client is None:
            raise ValueError(
                "AgentLoopManager.create needs llm_client: LLMServerManager.create(config, worker_group=...)"
                ".get_client()"
            )
        return cls(config, llm_client=llm_client, teacher_client=teacher_client, **kwargs)

    def _num_workers(self, nodes: list[str] | None) -> int:
        configured = self.rollout_config.agent.num_workers
        if configured is not None:
            return int(configured)
        if ray.cluster_resources().get("GPU", 0) > 0:
            return _GPU_DEFAULT_WORKERS
        return len(set(nodes)) if nodes else 0  # one node without GPUs: in this process

    def _server_nodes(self) -> list[str] | None:
        """The node of each replica's worker; None on a one-node cluster (asking would wait for every replica's
        process to start, which the agent-loop workers need not: they start beside them)."""
        if sum(1 for node in ray.nodes() if node.get("Alive")) <= 1:
            return None
        return ray.get([h.actor.__ray_call__.remote(_node_id) for h in self.server_handles])

    def _init_agent_loop_workers(self, reward_fn: Any, val_reward_fn: Any) -> None:
        nodes = self._server_nodes()
        cls = self.agent_loop_workers_class
        count = self._num_workers(nodes)
        servers = self.server_handles if self.llm_client is None else self.llm_client  # the workers route with it
        # a recipe's worker class need not know the argument: given only when there are teachers
        teachers = {} if self.teacher_client is None else {"teacher_client": self.teacher_client}
        if count == 0:  # the agent loops' own copies of the reward managers (they quiet their printing)
            local = getattr(cls, "__ray_actor_class__", cls)
            worker = local(self.config, servers, copy.copy(reward_fn), copy.copy(val_reward_fn), **teachers)
            self.agent_loop_workers = [InProcessAgentLoopWorker(worker)]
            logger.info("agent loops: in this process (rollout.agent.num_workers=0)")
            return
        if not hasattr(cls, "remote"):
            cls = ray.remote(num_cpus=0)(cls)
        self.agent_loop_workers = []
        for i in range(count):
            options: dict[str, Any] = {"num_cpus": 0}
            if nodes:  # each worker on the node of the replicas it mostly serves
                node = nodes[i % len(nodes)]
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node, soft=True)
            self.agent_loop_workers.append(
                cls.options(**options).remote(self.config, servers, reward_fn, val_reward_fn, **teachers)
            )

    # ------------------------------------------------------------------ generation
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """One response per row of ``prompts`` (already repeated ``n`` times); ``meta_info`` keys the caller set win
        over the defaults."""
        start = time.perf_counter()
        gen = prompts.select(
            list(prompts.batch.keys()) if prompts.batch is not None else [],
            meta_info_keys=list(prompts.meta_info),
        )
        gen.meta_info = {
            "eos_token_id": self.tokenizer.eos_token_id,
            "pad_token_id": self.tokenizer.pad_token_id,
            "global_steps": self.step(),
            "validate": False,
            **gen.meta_info,
        }
        if "prompt_index" not in gen.batch.keys():  # else every row counts as its own prompt
            gen.batch["prompt_index"] = torch.arange(len(gen))
        if "sample_index" not in gen.batch.keys():
            gen.batch["sample_index"] = sample_indices(gen.batch["prompt_index"])
        pieces = _split(gen, len(self.agent_loop_workers))
        try:
            if isinstance(self.agent_loop_workers[0], InProcessAgentLoopWorker):
                outputs = [self.agent_loop_workers[0].generate_sequences(piece) for piece in pieces]
            else:
                workers = self.agent_loop_workers
                outputs = ray.get([w.generate_sequences.remote(p) for w, p in zip(workers, pieces)])
        except (RayTaskError, RayActorError) as e:
            self._raise_if_a_server_died(e)
            raise
        metas = [out.meta_info for out in outputs]
        for out in outputs:
            out.meta_info = {}
        output = DataProto.concat(outputs)
        metrics = agent_loop_metrics([m for meta in metas for m in meta["metrics"]], output)
        for meta in metas:
            for key, value in meta.get("reward_metrics", {}).items():
                metrics[key] = metrics.get(key, 0) + value
        output.meta_info = {
            "timing": {"generate_sequences": time.perf_counter() - start},
            "metrics": metrics,
            "reward_extra_keys": metas[0].get("reward_extra_keys", []),
        }
        return output

    def _raise_if_a_server_died(self, error: BaseException) -> None:
        """A generation failed: when a rollout worker is dead, say which (a ``WorkerDiedError`` naming it)."""
        dead = []
        for rank, handle in enumerate(self.server_handles):
            try:
                ray.get(handle.actor.__ray_call__.remote(_node_id), timeout=30)
            except (RayActorError, ray.exceptions.GetTimeoutError):
                dead.append(rank)
        if dead:
            names = ", ".join(self.server_handles[rank].name for rank in dead)
            group = self.worker_group
            where = f"worker group {group.name_prefix!r}" if group is not None else "llm_client's servers"
            raise WorkerDiedError(
                f"{where}: {names} died while running 'generate' (a rollout server of the agent loops): {error}"
            ) from error

    # ------------------------------------------------------------------ replicas lent to generation
    def add_servers(self, handles: list[Any]) -> None:
        """Every agent-loop worker routes new requests to ``handles`` too (veRL's load-balancer call: the training
        workers' engines lent to generation while the trainer would wait)."""
        self._routing("add_servers", handles)

    def remove_servers(self, handles: list[Any]) -> None:
        """No agent-loop worker sends ``handles`` a new request; what they serve finishes (:meth:`wait_drained`)."""
        self._routing("remove_servers", handles)

    def wait_drained(self, handles: list[Any], timeout_s: float = 600.0, poll_s: float = 0.02) -> None:
        """Return once no agent-loop worker has a request in flight on ``handles`` (after :meth:`remove_servers`);
        TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (left := sum(self._routing("in_flight_on", handles))) > 0:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{left} request(s) still in flight on {handles} after {timeout_s} s")
            time.sleep(poll_s)

    def served_by(self, handles: list[Any]) -> int:
        """Requests the agent-loop workers have sent to ``handles`` so far."""
        return sum(self._routing("served_by", handles))

    def _routing(self, call: str, handles: list[Any]) -> list[Any]:
        if self.llm_client is not None:
            raise NotImplementedError(
                f"AgentLoopManager.{call}: built from an llm_client, whose servers it does not route"
            )
        workers = self.agent_loop_workers
        if isinstance(workers[0], InProcessAgentLoopWorker):
            return [worker.routing(call, handles) for worker in workers]
        return ray.get([worker.routing.remote(call, handles) for worker in workers])

    def replica_handles(self, worker_group: Any) -> list[ServerHandle]:
        """The server handles of ``worker_group``'s engines (one per worker), named by the group and rank."""
        prefix = getattr(worker_group, "method_prefix", "")
        return [
            ServerHandle(actor, prefix, f"{worker_group.name_prefix} rank {rank}")
            for rank, actor in enumerate(worker_group.workers)
        ]

    # ------------------------------------------------------------------ memory
    def wake_up(self) -> None:
        """Restore the replicas' memory (memory only: a hybrid engine that dropped its weights needs a weight push
        before it generates)."""
        self._memory_group("wake_up").wake_up()

    def sleep(self) -> None:
        """Free the replicas' memory (hybrid: until the next weight push)."""
        self._memory_group("sleep").sleep()

    def _memory_group(self, call: str) -> Any:
        if self.worker_group is None:
            raise RuntimeError(
                f"AgentLoopManager.{call}: built from an llm_client, this manager holds no worker group; use "
                f"CheckpointEngineManager.{call}_replicas() (veRL 0.10's place for it)"
            )
        return self.worker_group
