"""The FSDP training workers the driver talks to: actor/ref, with a rollout engine in the hybrid engine; critic and
reward model. A rollout server without training code is :class:`~verl.workers.rollout_worker.RolloutServerWorker`.

Thin by design: each registered method moves data in and out and delegates to the training engine
(`verl.workers.engine`), the actor/critic algorithms (`DataParallelPPOActor` / `DataParallelPPOCritic`), the rollout
engine (`verl.workers.rollout`) and the weight-sync engine (`verl.checkpoint_engine`).

In the hybrid engine (role ``actor_rollout`` or ``actor_rollout_ref``) the trainer and the rollout engine share the
process. Three single-purpose calls, each the driver's to make: ``update_weights(version)`` pushes the actor's
weights into the engine as weight version ``version`` (waking the memory it loads into), ``sleep`` frees the
engine's memory, ``wake_up`` restores it. Generation never syncs weights: an engine whose weights were freed
refuses to generate until the next push, and one generating while the actor has been updated since the last push
logs a warning (its samples come from the older version, which they record).

A hybrid worker is also a *server* (:class:`~verl.workers.rollout_worker.RolloutServing`: ``generate``,
``generate_wave``, ``abort_requests``, run on their own event loop while the registered training methods run one
at a time). A training call that arrives while requests are in flight is refused (``trainer.mode=sync`` trains
only between generations).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.single_controller.base.decorator import (
    Dispatch,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.distributed import initialize_global_process_group
from verl.utils.flops_counter import FlopsCounter
from verl.utils.fs import copy_to_local
from verl.workers import fsdp_legacy
from verl.workers.actor import DataParallelPPOActor
from verl.workers.actor.log_prob_metrics import metrics_meta, old_log_prob_metrics, rollout_mismatch_metrics
from verl.workers.config.builders import (
    build_actor_config,
    build_critic_config,
    build_model_config,
    build_ref_config,
    build_rollout_config,
)
from verl.workers.config.distillation import DistillationConfig
from verl.workers.config.lora import LoraSpec
from verl.workers.engine import get_engine_class
from verl.workers.engine.sharding import create_device_mesh, get_sharding_strategy
from verl.workers.engine.snapshots import ParameterSnapshots
from verl.workers.profiled_worker import ProfiledWorker
from verl.workers.remote_rollout import RemoteRolloutWeights
from verl.workers.role_engines import actor_class, critic_class, data_parallel_layout, engine_block
from verl.workers.rollout_worker import RolloutServing, register_meshes

__all__ = [
    "ActorRolloutRefWorker",
    "AsyncActorRolloutRefWorker",
    "CriticWorker",
    "ProfiledWorker",
    "RewardModelWorker",
    "create_device_mesh",  # veRL's helpers, from verl.workers.engine.sharding
    "get_sharding_strategy",
    "rollout_mismatch_metrics",  # from verl.workers.actor.log_prob_metrics
]

logger = logging.getLogger(__name__)

ROLES = ("actor", "ref", "actor_ref", "actor_rollout", "actor_rollout_ref")


class ActorRolloutRefWorker(RolloutServing, RemoteRolloutWeights, fsdp_legacy.LegacyWorkerAPI):
    """Actor (trainer), rollout engine and/or reference policy in one process.

    Roles ``actor_rollout`` / ``actor_rollout_ref`` are the hybrid engine; ``actor`` / ``actor_ref`` train and push
    their weights to rollout servers in other processes (:mod:`verl.workers.remote_rollout`;
    :class:`~verl.workers.rollout_worker.RolloutServerWorker`).

    Args:
        config: the ``actor_rollout_ref`` config (``model``, ``actor``, ``rollout``, ``ref``).
        role: ``actor`` | ``ref`` | ``actor_ref`` | ``actor_rollout`` | ``actor_rollout_ref``.
    """

    def __init__(self, config: Any, role: str, **kwargs: Any) -> None:
        if role == "rollout":
            raise ValueError(
                "ActorRolloutRefWorker role='rollout': a rollout server without training code is "
                "verl.workers.rollout_worker.RolloutServerWorker"
            )
        if role not in ROLES:
            raise ValueError(f"ActorRolloutRefWorker role={role!r}; use one of {list(ROLES)}")
        # veRL 0.10's argument: the actor's update gains the distillation term (the batch brings the teachers' view)
        self.distillation_config = DistillationConfig.from_config(kwargs.get("distillation_config"))
        trains = role in ("actor", "actor_ref", "actor_rollout", "actor_rollout_ref")
        profiled = config["actor"] if trains else config.get(role, {})
        super().__init__(config["model"].get("external_lib"), profiled.get("profiler"))
        self.config = OmegaConf.create(config) if isinstance(config, dict) else config
        self.role = self.profile_role = role
        self._is_actor = trains
        self._is_rollout = role in ("actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_ref", "actor_rollout_ref")
        initialize_global_process_group()
        self.model_config = build_model_config(config["model"])
        self.rollout_config = build_rollout_config(config["rollout"]) if self._is_actor else None
        self.actor_config = None
        # (dp_rank, is_collect, dp_size) of the actor's and the ref's batch layouts (a Megatron engine's differ)
        layouts = {
            mesh: data_parallel_layout(config.get(mesh), self.rank, self.world_size)
            for mesh in ("actor", "ref")
            if (mesh == "actor" and trains) or (mesh == "ref" and self._is_ref)
        }
        if self._is_actor:
            rollout_n = self.rollout_config.n if self.rollout_config is not None else 1
            self.actor_config = build_actor_config(
                config["actor"], rollout_n=rollout_n, dp_size=layouts["actor"][2], model=self.model_config
            )
        self.ref_config = build_ref_config(config.get("ref", {}), model=self.model_config) if self._is_ref else None
        self._init_legacy_attributes()
        self.lora = LoraSpec.from_config(self.model_config)
        # with LoRA the actor is the reference policy too (its adapters disabled): no second copy of the weights
        self._ref_in_actor = self._is_ref and self._is_actor and self.lora is not None
        self._base_synced = False  # with LoRA, pushes after the first carry the adapters only
        self.verify_weight_sync = bool(int(os.environ.get("VERL_VERIFY_WEIGHT_SYNC", "0")))
        self._actor_ahead = False  # the actor changed since the last push (update_actor, load_checkpoint)
        register_meshes(self, {mesh: layout[:2] for mesh, layout in layouts.items()})

    # ------------------------------------------------------------------ set-up
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        """Build the engines of this worker's roles (every rank together); the rollout gets the actor's weights as
        version 0."""
        model = self.model_config
        if self._is_actor:
            cfg = self.actor_config
            self._build_model_optimizer(
                model.path,
                engine_block(cfg),
                cfg.optim,
                model.override_config,
                enable_gradient_checkpointing=model.enable_gradient_checkpointing,
                trust_remote_code=model.trust_remote_code,
                role="actor",
            )
            self.actor = actor_class(cfg.strategy)(cfg, engine=self.actor_engine, distillation=self.distillation_config)
        if self._ref_in_actor:
            self.ref_engine = self.actor_engine
            self.ref_policy = DataParallelPPOActor(self.ref_config, engine=self.actor_engine)
            logger.info("LoRA: the reference policy is the actor's base model (adapters disabled), no second copy")
        elif self._is_ref:
            self._build_model_optimizer(
                model.path,
                engine_block(self.ref_config),
                None,
                model.override_config,
                trust_remote_code=model.trust_remote_code,
                role="ref",
            )
            self.ref_policy = actor_class(self.ref_config.strategy)(self.ref_config, engine=self.ref_engine)
        if self._is_rollout:
            self._build_rollout(trust_remote_code=model.trust_remote_code)
        if self._is_actor:
            self.flops_counter = FlopsCounter(self.actor_engine.model_config)
            self.checkpoint_manager = FSDPCheckpointManager(
                self.actor_engine.module,
                self.actor_engine.optimizer,
                self.actor_engine.lr_scheduler,
                processing_class=self.processor if self.processor is not None else self.tokenizer,
                checkpoint_config=self.actor_config.checkpoint,
            )

    # ------------------------------------------------------------------ rollout
    def _check_serving(self, call: str) -> None:
        """The server's checks, and a warning when the engine serves weights older than the actor's."""
        super()._check_serving(call)
        if self._actor_ahead:
            self._actor_ahead = False  # warned once per push
            logger.warning(
                "rank %d: the rollout generates with weight version %d while the actor has changed since that push; "
                "call checkpoint_manager.update_weights() after update_actor to generate with the new weights",
                self.rank,
                self.rollout.weight_version,
            )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def update_weights(self, version: int | None = None, to: str | None = None) -> dict[str, float]:
        """Load the actor's current weights into the rollout engine — this worker's (waking the memory they load
        into) or the connected rollout server's — as weight version ``version`` (default: the engine's version + 1),
        verified when asked. ``to``: ``"engine"`` or ``"servers"`` for a worker that has both (separate_async's
        hybrid switch); default: its engine."""
        if not self._is_actor:
            raise RuntimeError(f"update_weights on a worker of role {self.role!r}, which has no actor to push from")
        target = self._weight_target(to)
        local = self._is_rollout and target is self.rollout
        if local:
            self._check_idle("update_weights")
            self.rollout.wake_up(["weights"])
        sender = self._servers_engine if not local and self._servers_engine is not None else self.checkpoint_engine
        bucket = self.rollout_config.checkpoint_engine.update_weights_bucket_megabytes * 2**20
        # with LoRA the engine keeps the base weights of the first push; later pushes send the adapters alone
        adapters_only = self.lora is not None and self._base_synced
        with target.weight_update(version):  # all buckets are one weight load: one new version
            stats = sender.send_weights(
                self.actor_engine.iter_full_state_dict(bucket_bytes=bucket, adapters_only=adapters_only),
                target,
                verify=self.verify_weight_sync,
            )
        if local:
            self.rollout.wake_up(["kv_cache"])
            self._rollout_asleep = self._actor_ahead = False
        elif not self._is_rollout:
            self._actor_ahead = False
        self._base_synced = True
        stats["adapters_only"] = float(adapters_only)
        return {f"weight_sync/{k}": v for k, v in stats.items()}

    # ------------------------------------------------------------------ actor / ref
    def _log_prob_meta(self, data: DataProto, micro: int | None, dynamic_bsz: bool, max_token_len: int) -> DataProto:
        data.meta_info.setdefault("temperature", self.rollout_config.temperature if self.rollout_config else 1.0)
        data.meta_info["micro_batch_size"] = micro or len(data)
        data.meta_info["use_dynamic_bsz"] = dynamic_bsz
        data.meta_info["max_token_len"] = max_token_len
        return data

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """``old_log_probs`` and ``entropys`` of the responses under the current actor (+ ``sum_pi_squared`` with
        ``actor.calculate_sum_pi_squared``); mismatch metrics against ``rollout_log_probs`` when the batch carries
        them."""
        if not self._is_actor:
            raise RuntimeError(f"compute_log_prob on a worker of role {self.role!r}, which has no actor")
        self._check_idle("compute_log_prob")
        cfg = self.rollout_config
        data = self._log_prob_meta(
            data,
            cfg.log_prob_micro_batch_size_per_gpu,
            cfg.log_prob_use_dynamic_bsz,
            cfg.log_prob_max_token_len_per_gpu,
        )
        with self.actor_engine.on_device(optimizer=False):
            outputs = self.actor.compute_log_prob_outputs(
                data, calculate_entropy=True, calculate_sum_pi_squared=self.actor_config.calculate_sum_pi_squared
            )
        log_probs = outputs.pop("log_probs")
        metrics = old_log_prob_metrics(data, log_probs, outputs["entropys"])
        return DataProto.from_dict({"old_log_probs": log_probs, **outputs}, meta_info=metrics_meta(metrics))

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="ref"))
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """``ref_log_prob`` of the responses under the frozen reference policy."""
        if not self._is_ref:
            raise RuntimeError(f"compute_ref_log_prob on a worker of role {self.role!r}, which has no ref policy")
        self._check_idle("compute_ref_log_prob")
        ref = self.ref_config
        data = self._log_prob_meta(
            data,
            ref.log_prob_micro_batch_size_per_gpu,
            ref.log_prob_use_dynamic_bsz,
            ref.log_prob_max_token_len_per_gpu,
        )
        base = self.actor_engine.adapters_disabled() if self._ref_in_actor else contextlib.nullcontext()
        with self.ref_engine.on_device(optimizer=False), base:
            log_probs, _ = self.ref_policy.compute_log_prob(data, calculate_entropy=False)
        return DataProto.from_dict({"ref_log_prob": log_probs})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="actor"))
    def update_actor(self, data: DataProto) -> DataProto:
        """One PPO update of the actor on this rank's share; returns ``actor/*`` metrics (and ``actor/lr``)."""
        if not self._is_actor:
            raise RuntimeError(f"update_actor on a worker of role {self.role!r}, which has no actor")
        self._check_idle("update_actor")
        self._actor_ahead = self._is_rollout
        data.meta_info.setdefault("temperature", self.rollout_config.temperature if self.rollout_config else 1.0)
        start = time.perf_counter()
        old: DataProto | None = None
        if data.meta_info.get("old_log_prob_in_update") and self._actor_has_dropout:
            # train-mode dropout makes the update's forward differ from the old policy's: a pass of its own
            old = self.compute_log_prob(data)
            data.meta_info["old_log_prob_in_update"] = False
            data.batch["old_log_probs"] = old.batch["old_log_probs"]
        with self.actor_engine.on_device():
            metrics: dict[str, Any] = self.actor.update_policy(data)
        metrics["actor/lr"] = self.actor_engine.get_lr()
        self.actor_engine.lr_scheduler_step()
        metrics["perf/update_actor_seconds"] = time.perf_counter() - start
        if self.actor.on_policy_outputs is not None:  # the update's forward gave the old log-probs
            outputs = self.actor.on_policy_outputs
            old = DataProto.from_dict(
                {"old_log_probs": outputs["old_log_probs"]},
                meta_info=metrics_meta(old_log_prob_metrics(data, **outputs)),
            )
        if old is None:
            return DataProto(meta_info=metrics_meta(metrics))
        # the old-log-prob stage's metrics first, the update's over them (the order the driver logs them in)
        return DataProto.from_dict(
            {"old_log_probs": old.batch["old_log_probs"]},
            meta_info=metrics_meta({**old.meta_info["metrics"], **metrics}),
        )

    # ------------------------------------------------------------------ π_old copies (veRL 0.10's names)
    def _snapshots(self, call: str) -> ParameterSnapshots:
        if not self._is_actor:
            raise RuntimeError(f"{call} on a worker of role {self.role!r}, which has no actor")
        if getattr(self.actor_engine, "keeps_main_params", False):
            raise NotImplementedError(
                f"{call}: the actor's Megatron engine steps fp32 main copies of its {self.actor_engine.dtype} "
                "parameters, which a parameter snapshot does not hold; use megatron.dtype=float32 for π_old copies"
            )
        if getattr(self, "_actor_snapshots", None) is None:  # made on first use: a recipe's init_model may build
            self._actor_snapshots = ParameterSnapshots(self.actor_engine.module)
        return self._actor_snapshots

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_model_to_cpu(self, n: int) -> None:
        """Keep a host copy of the actor's parameters (this rank's shards) as copy ``n``."""
        with self.actor_engine.on_device(optimizer=False):
            self._snapshots("save_model_to_cpu").save(n)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def restore_model_from_cpu(self, n: int) -> None:
        """Write copy ``n`` back into the actor's parameters (the optimizer state is untouched)."""
        with self.actor_engine.on_device(optimizer=False):
            self._snapshots("restore_model_from_cpu").restore(n)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def clear_cpu_model(self, n: int) -> None:
        """Drop copy ``n``."""
        self._snapshots("clear_cpu_model").clear(n)

    # ------------------------------------------------------------------ checkpoints
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """Save the actor's sharded model, optimizer, scheduler and random states under ``local_path``, with its HF
        config and tokenizer in ``local_path/huggingface`` (the weights too when ``checkpoint.save_contents`` has
        ``hf_model``), through ``checkpoint_manager`` (a recipe's, if its ``init_model`` made one). Rotation
        (``max_ckpt_to_keep``) is the driver's."""
        self.checkpoint_manager.save_checkpoint(local_path, global_step=global_step)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        """Load what :meth:`save_checkpoint` wrote; the rollout keeps its weights until the next push."""
        self.checkpoint_manager.load_checkpoint(local_path)
        self._actor_ahead = self._is_rollout


class AsyncActorRolloutRefWorker(ActorRolloutRefWorker):
    """veRL's worker for async rollout (agent loops, server mode). Ours serves requests already (``generate``,
    ``generate_wave``, ``abort_requests``), so this is the same worker under veRL's name."""


class CriticWorker(ProfiledWorker):
    """The value model: ``compute_values`` and ``update_critic``.

    Args:
        config: the ``critic`` config.
    """

    profile_role = "critic"

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config["model"].get("external_lib"), config.get("profiler"))
        initialize_global_process_group()
        dp_rank, is_collect, dp_size = data_parallel_layout(config, self.rank, self.world_size)
        self.config = build_critic_config(config, dp_size=dp_size)
        register_meshes(self, {"critic": (dp_rank, is_collect)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config
        self.critic_engine = get_engine_class(cfg.strategy)(
            copy_to_local(cfg.model.path, use_shm=cfg.model.use_shm),
            engine_block(cfg),
            cfg.optim,
            role="critic",
            enable_gradient_checkpointing=cfg.model.enable_gradient_checkpointing,
            trust_remote_code=cfg.model.trust_remote_code,
            override_config=cfg.model.override_config,
            lora=LoraSpec.from_config(cfg.model, key="critic.model"),
        )
        self.critic = critic_class(cfg.strategy)(cfg, engine=self.critic_engine)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    def compute_values(self, data: DataProto) -> DataProto:
        data.meta_info["micro_batch_size"] = self.config.forward_micro_batch_size_per_gpu or len(data)
        data.meta_info["use_dynamic_bsz"] = self.config.use_dynamic_bsz
        data.meta_info["max_token_len"] = self.config.forward_max_token_len_per_gpu
        with self.critic_engine.on_device(optimizer=False):
            return DataProto.from_dict({"values": self.critic.compute_values(data)})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="critic"))
    def update_critic(self, data: DataProto) -> DataProto:
        with self.critic_engine.on_device():
            metrics: dict[str, Any] = self.critic.update_critic(data)
        metrics["critic/lr"] = self.critic_engine.get_lr()
        self.critic_engine.lr_scheduler_step()
        return DataProto(meta_info=metrics_meta(metrics))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(
        self, local_path: str, hdfs_path: str | None = None, global_step: int = 0, max_ckpt_to_keep: int | None = None
    ) -> None:
        """As the actor's: sharded state, random states and ``local_path/huggingface``."""
        cfg = self.config
        hf_weights = "hf_model" in cfg.checkpoint.save_contents
        tokenizer = cfg.model.tokenizer_path or cfg.model.path
        self.critic_engine.save_checkpoint(local_path, hf_weights=hf_weights, tokenizer_path=tokenizer)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        self.critic_engine.load_checkpoint(local_path)


class RewardModelWorker(ProfiledWorker):
    """A reward model scoring whole sequences: ``rm_scores`` holds its score at the last response token.

    Args:
        config: the ``reward_model`` config (``model.path``, ``micro_batch_size_per_gpu``, ``model.fsdp_config``).
    """

    profile_role = "rm"

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config["model"].get("external_lib"), config.get("profiler"))
        initialize_global_process_group()
        self.config = config
        register_meshes(self)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        model_cfg = self.config["model"]
        fsdp_config = dict(model_cfg.get("fsdp_config", {}) or {})
        fsdp_config["forward_only"] = True
        self.rm_engine = get_engine_class(self.config.get("strategy", "fsdp"))(
            copy_to_local(model_cfg["path"], use_shm=bool(model_cfg.get("use_shm", False))),
            fsdp_config,
            None,
            role="reward_model",
            trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
        )

    @torch.no_grad()
    def _score(self, batch: DataProto) -> torch.Tensor:
        device = self.rm_engine.device
        b = {key: batch.batch[key].to(device) for key in ("input_ids", "attention_mask", "position_ids")}
        output = self.rm_engine.module(**b, use_cache=False)
        logits = output.logits.squeeze(-1).float()  # (bs, seq): a score per position
        positions = torch.arange(logits.shape[-1], device=logits.device)
        last = (positions * b["attention_mask"]).argmax(-1, keepdim=True)  # the last attended position
        return logits.gather(-1, last).squeeze(-1).cpu()

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="reward"))
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """``rm_scores`` (bs, response_length): the model's score of each sequence at its last response token."""
        micro = self.config.get("micro_batch_size_per_gpu") or len(data)
        with self.rm_engine.on_device(optimizer=False):
            scores = torch.cat([self._score(m) for m in data.split(micro)])
        if hasattr(self.rm_engine.module, "reshard"):
            self.rm_engine.module.reshard()
        response_mask = data.batch["response_mask"] if "response_mask" in data.batch.keys() else None
        responses = data.batch["responses"]
        if response_mask is None:
            response_mask = data.batch["attention_mask"][:, -responses.shape[-1] :]
        rm_scores = torch.zeros(responses.shape, dtype=torch.float32)
        last = (response_mask.sum(-1) - 1).clamp(min=0)
        rm_scores[torch.arange(len(data)), last] = scores * (response_mask.sum(-1) > 0)
        return DataProto.from_dict({"rm_scores": rm_scores})
