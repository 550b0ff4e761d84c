"""The workers that host a rollout engine: what serving requests is, apart from training.

- :class:`RolloutServing` is the base of every worker that may host an engine (``rollout``; None in one without):
  the server calls ``generate`` / ``generate_wave`` / ``abort_requests`` (:func:`server_method` s: Ray runs them in
  the actor's own concurrency group on its own event loop, many requests in flight at once, while the registered
  methods run one at a time), the engine's memory (``sleep`` / ``wake_up``), weight-sync verification and digests.
  The hybrid training worker (:class:`~verl.workers.fsdp_workers.ActorRolloutRefWorker`, roles ``actor_rollout`` /
  ``actor_rollout_ref``) is one.
- :class:`RolloutServerWorker` is role ``rollout``: a rollout server in a process of its own, with no training code
  — beside the training workers (``colocate_async``'s resident servers), on a pool of its own (``separate_async``)
  or alone (``main_generation``). It builds its engine from the model path and receives the weights the training
  workers push: through shared memory from the training worker of its rank (``weight_receiver``), or staged from
  the weight group's broadcast and loaded when the driver says (``join_weight_group``, ``receive_weights``,
  ``apply_weights``).
  The sending side is :class:`~verl.workers.remote_rollout.RemoteRolloutWeights`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from typing import Any

import torch
from omegaconf import OmegaConf

from verl.checkpoint_engine.collective import BroadcastReceiver, StagedWeights, weight_group
from verl.checkpoint_engine.shm import ShmWeightReceiver
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register, server_method
from verl.utils.device import get_device_name
from verl.utils.distributed import initialize_global_process_group
from verl.utils.fs import copy_to_local
from verl.workers.config.builders import build_model_config, build_rollout_config
from verl.workers.config.lora import LoraSpec
from verl.workers.profiled_worker import ProfiledWorker

__all__ = ["RolloutServerWorker", "RolloutServing", "register_meshes"]

logger = logging.getLogger(__name__)

MESHES = ("actor", "rollout", "ref", "critic", "reward")
RECEIVER_OPS = ("begin", "load", "end", "weight_digests")


def register_meshes(worker: Worker, layouts: dict[str, tuple[int, bool]] | None = None) -> None:
    """Register the dispatch info of every mesh name: ``layouts[mesh]`` is ``(dp_rank, is_collect)`` of a role laid
    out over several ranks per data-parallel rank (a Megatron engine's tensor and pipeline ranks share one shard of
    the batch; one of them returns the result); any other mesh is pure data parallelism: every rank is its own dp
    rank and is collected."""
    for mesh in MESHES:
        dp_rank, is_collect = (layouts or {}).get(mesh, (worker.rank, True))
        worker._register_dispatch_collect_info(mesh, dp_rank=dp_rank, is_collect=is_collect)


class RolloutServing(ProfiledWorker):
    """A worker that may host a rollout engine (see the module docstring). Subclasses set :attr:`rollout` when they
    build one and :attr:`role` for the messages."""

    role = "worker"
    rollout: Any = None  # the engine (verl.workers.rollout), None until built or in a worker without one
    verify_weight_sync = False  # every weight load checked bit for bit (tests; env VERL_VERIFY_WEIGHT_SYNC=1)
    _rollout_asleep = False  # the engine's memory is released (sleep); says nothing about its weights

    def _check_serving(self, call: str) -> None:
        """Refuse ``call`` (a generation) on a worker without a rollout engine or with a sleeping one."""
        if self.rollout is None:
            raise RuntimeError(f"{call} on a worker of role {self.role!r}, which has no rollout engine")
        if self._rollout_asleep:
            raise RuntimeError(
                f"{call} on rank {self.rank}: the rollout engine is asleep (its memory is "
                "released); push the weights (checkpoint_manager.update_weights()) or wake it first"
            )

    @server_method
    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any] | None = None,
        image_data: Any = None,
        video_data: Any = None,
    ) -> Any:
        """One request to this worker's rollout engine (veRL's server call): returns its ``TokenOutput``."""
        self._check_serving(f"generate({request_id!r})")
        return await self.rollout.generate(
            request_id,
            prompt_ids=prompt_ids,
            sampling_params=sampling_params,
            image_data=image_data,
            video_data=video_data,
        )

    @server_method
    async def generate_wave(self, requests: list[dict[str, Any]]) -> AsyncIterator[tuple[int, Any]]:
        """Requests (``request_id``, ``prompt_ids``, ``sampling_params``) submitted to the engine together — one
        batch, in this order — streaming ``(index, TokenOutput)`` as each finishes (call it with
        ``num_returns="streaming"``)."""
        self._check_serving(f"generate_wave({len(requests)} requests)")
        futures = self.rollout.submit_many(
            [(r["request_id"], r["prompt_ids"], r.get("sampling_params"), None) for r in requests]
        )
        index = {asyncio.wrap_future(future): i for i, future in enumerate(futures)}
        pending = set(index)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for future in done:
                yield index[future], future.result()

    @server_method
    async def abort_requests(self, request_ids: list[str] | None = None) -> dict[str, Any]:
        """Abort requests in flight (None: all); returns each one's partial ``TokenOutput`` by request id."""
        return await asyncio.to_thread(self.rollout.abort, request_ids)

    def _check_idle(self, what: str) -> None:
        """Refuse ``what`` while generation requests are in flight in any rank's engine (every rank decides
        together, so no rank is left waiting in a collective)."""
        in_flight = self.rollout.num_requests() if self.rollout is not None else 0
        total = in_flight
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            count = torch.tensor([in_flight], dtype=torch.int64)
            torch.distributed.all_reduce(count)
            total = int(count)
        if total:
            raise RuntimeError(
                f"{what}: {total} generation request(s) are in flight ({in_flight} on rank {self.rank}): "
                "trainer.mode=sync runs training calls only between generations"
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self) -> int:
        """Put the rollout engine to sleep (free its weights and KV cache where it can); returns the bytes it still
        holds."""
        self._check_idle("sleep")
        self.rollout.sleep()
        self._rollout_asleep = True
        return self.rollout.memory_bytes()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wake_up(self) -> int:
        """Restore a sleeping rollout engine's memory (weights and KV cache); returns the bytes it holds. Memory
        only: an engine that dropped its weights (the hf engine) holds no values until the next weight push and
        refuses to generate until then."""
        if self._rollout_asleep:
            self.rollout.wake_up(["weights", "kv_cache"])
            self._rollout_asleep = False
        return self.rollout.memory_bytes()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def set_weight_sync_verification(self, enabled: bool) -> None:
        """Check every weight sync bit for bit (always on in tests; env ``VERL_VERIFY_WEIGHT_SYNC=1``). Call it
        before ``init_model``: without verification a vLLM engine on CPU is built with packed, write-only weights."""
        if enabled and not getattr(self.rollout, "readable_weights", True):
            raise RuntimeError(
                "set_weight_sync_verification(True) after init_model: this vLLM engine was built with packed CPU "
                "weights, which cannot be read back to verify; enable verification before init_model"
            )
        self.verify_weight_sync = bool(enabled)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rollout_named_weight_digests(self) -> dict[str, str]:
        """Digests of the rollout engine's weights (for tests and debugging)."""
        from verl.checkpoint_engine import tensor_digest

        return {name: tensor_digest(t) for name, t in self.rollout.named_weights()}


class RolloutServerWorker(RolloutServing):
    """Role ``rollout``: a rollout server with no training code (see the module docstring).

    Args:
        config: the ``actor_rollout_ref`` config (``model`` and ``rollout`` are read).
        role: ``rollout`` (the argument the trainer gives every worker class).
        weights_from_path: the server's weights are the model path's and nothing is pushed to it (a served reward
            model): after a sleep, :meth:`wake_up` loads them from the path again where the engine dropped them.
    """

    profile_role = "rollout"

    def __init__(self, config: Any, role: str = "rollout", weights_from_path: bool = False, **kwargs: Any) -> None:
        if role != "rollout":
            raise ValueError(f"RolloutServerWorker role={role!r}: it only serves (role 'rollout')")
        super().__init__(config["model"].get("external_lib"), (config.get("rollout") or {}).get("profiler"))
        self.config = OmegaConf.create(config) if isinstance(config, dict) else config
        self.role = role
        initialize_global_process_group()
        self.model_config = build_model_config(config["model"])
        self.rollout_config = build_rollout_config(config["rollout"])
        self.lora = LoraSpec.from_config(self.model_config)
        self.verify_weight_sync = bool(int(os.environ.get("VERL_VERIFY_WEIGHT_SYNC", "0")))
        self._weight_receiver: ShmWeightReceiver | None = None
        self._broadcast_receiver: BroadcastReceiver | None = None
        self._staged: StagedWeights | None = None
        self.weights_from_path = bool(weights_from_path)
        register_meshes(self)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the engine from the model path (it holds the path's weights until the first push)."""
        from verl.workers.fsdp_legacy import build_rollout

        model = self.model_config
        self.rollout, _ = build_rollout(
            self.rollout_config,
            copy_to_local(model.path, use_shm=model.use_shm),
            device=get_device_name(),
            lora=self.lora,
            verify_weight_sync=self.verify_weight_sync,
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wake_up(self) -> int:
        """Restore the engine's memory (see :meth:`RolloutServing.wake_up`); a server with ``weights_from_path``
        whose engine dropped its weights on sleep loads them from the model path again."""
        reload = self._rollout_asleep and self.weights_from_path and not self.rollout.weights_survive_sleep
        held = RolloutServing.wake_up(self)
        if reload:
            from verl.workers.engine.hf_model import load_hf_model

            model = load_hf_model(
                self.rollout.model_path,
                value_model=False,
                dtype=torch.float32,  # the engine casts to its own dtype
                seed=0,
                trust_remote_code=self.model_config.trust_remote_code,
            )
            self.rollout.update_weights(model.state_dict().items())
            logger.info("rollout server %d: weights reloaded from %s after a sleep", self.rank, self.model_config.path)
        return held

    # ------------------------------------------------------------------ weights pushed through shared memory
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def weight_receiver(self, op: str, *args: Any) -> Any:
        """Called by the training worker that pushes to this server: ``open(path, nbytes)`` maps its shared
        buffer; ``begin(version)`` / ``load(slots)`` / ``end()`` / ``weight_digests()`` are those of
        :class:`~verl.checkpoint_engine.shm.ShmWeightReceiver`."""
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

    # ------------------------------------------------------------------ weights broadcast across pools
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def join_weight_group(
        self, host: str, port: int, world_size: int, backend: str = "gloo", timeout_s: float = 600.0
    ) -> None:
        """Join the push's process group as rank ``1 + this server's rank``; pushes are staged beside the engine
        (:meth:`receive_weights`) until :meth:`apply_weights` loads one."""
        self._staged = StagedWeights()
        group = weight_group(host, port, 1 + self.rank, world_size, backend, timeout_s)
        self._broadcast_receiver = BroadcastReceiver(group, self._staged, device="cpu" if backend == "gloo" else "cuda")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def receive_weights(self) -> int | None:
        """Take part in one push (called before the trainer's ``update_weights``, returns when it ends): its
        tensors are staged, the engine goes on generating. Returns the staged version (None: the trainer closed
        the group)."""
        if self._broadcast_receiver is None:
            raise RuntimeError(f"receive_weights on rollout server {self.rank}: it joined no weight group")
        return self._broadcast_receiver.receive()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def apply_weights(self, version: int, drop_older: bool = True) -> int:
        """Load staged weight ``version`` into the engine (between two of its decode steps; the older staged
        versions are dropped unless ``drop_older`` is false), verified bit for bit when asked; returns the engine's
        version."""
        if self._staged is None:
            raise RuntimeError(f"apply_weights on rollout server {self.rank}: it joined no weight group")
        self._staged.apply(self.rollout, int(version), verify=self.verify_weight_sync, drop_older=drop_older)
        return int(self.rollout.weight_version)
