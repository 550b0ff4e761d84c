"""veRL's legacy worker internals, which research recipes call from their ``init_model`` overrides, over our engine.

veRL's ``ActorRolloutRefWorker`` builds FSDP modules in ``_build_model_optimizer`` and a rollout in
``_build_rollout``; recipes (SPPO, SPIN, PRIME) subclass the worker, override ``init_model`` and call those, then
wrap the returned module in their own ``DataParallelPPOActor`` subclass. Here the same calls build our
``FSDPEngine`` (by ``strategy``, `verl.workers.engine.get_engine_class`) and record it where the worker's own
methods look (``actor_engine`` / ``ref_engine``), so that after a recipe's ``init_model`` the engine's requests,
``compute_log_prob``, ``update_actor``, checkpoints and weight pushes work as after ours — and ours goes through the
same functions. What a recipe gets back:

- ``module_fsdp``: the engine's module (FSDP2 shards in place, so it is also the unwrapped model:
  ``module_fsdp._fsdp_wrapped_module is module_fsdp``); it and the optimizer carry their engine
  (`verl.utils.fsdp_utils.engine_of`), which the offload helpers, ``DataParallelPPOActor`` and
  ``FSDPCheckpointManager`` use.
- the optimizer and lr scheduler (None for a forward-only role) and the model's Hugging Face config.

Refused by name, since they would change results or need kernels we do not have: ``use_fused_kernels``,
``use_liger``, ``enable_activation_offload``. ``use_remove_padding`` is the actor's switch (the recipe sets it on
``config.actor``), not the model's.

The functions take explicit arguments; the worker's methods (`verl.workers.fsdp_workers`) are thin wrappers.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from verl.base_config import omega_conf_to_dataclass
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.device import get_device_name
from verl.utils.flops_counter import FlopsCounter
from verl.utils.fs import copy_to_local
from verl.utils.fsdp_utils import attach_engine
from verl.utils.torch_functional import has_active_dropout
from verl.workers.config.engine import FSDPEngineConfig, McoreEngineConfig
from verl.workers.engine import get_engine_class
from verl.workers.sharding_manager.fsdp_ulysses import FSDPUlyssesShardingManager

__all__ = [
    "LegacyHandles",
    "LegacyWorkerAPI",
    "build_engine",
    "build_rollout",
    "legacy_handles",
    "load_processing_class",
    "normalize_batch_sizes",
    "offload_flags",
]

logger = logging.getLogger(__name__)

LegacyHandles = tuple[torch.nn.Module, torch.optim.Optimizer | None, Any, Any]


def normalize_batch_sizes(config: DictConfig, per_rank_mini_batch_size: int) -> None:
    """veRL's worker ``__init__`` normalisation of ``config.actor`` (a raw ``actor_rollout_ref`` config): its
    ``ppo_mini_batch_size`` becomes the per-rank one (× ``rollout.n`` ÷ data-parallel size, computed and checked
    by the typed ``ActorConfig`` as ``ppo_mini_batch_size_per_rank``), so a recipe's actor built from
    ``config.actor`` splits this rank's share as veRL's does. Our own actor reads the typed config, never this key.
    """
    with open_dict(config.actor):
        config.actor.ppo_mini_batch_size = int(per_rank_mini_batch_size)


def offload_flags(config: Any, *, is_actor: bool, is_ref: bool) -> tuple[bool, bool]:
    """``(_is_offload_param, _is_offload_optimizer)`` as veRL's worker reads them: the actor's ``fsdp_config``, or
    for a ref-only worker the ref's parameter offload."""
    if is_actor:
        fsdp = config["actor"].get("fsdp_config", {}) or {}
        return bool(fsdp.get("param_offload", False)), bool(fsdp.get("optimizer_offload", False))
    if is_ref:
        fsdp = config.get("ref", {}).get("fsdp_config", {}) or {}
        return bool(fsdp.get("param_offload", False)), False
    return False, False


def _refuse(use_fused_kernels: bool, use_liger: bool, enable_activation_offload: bool) -> None:
    named = [
        name
        for name, value in (
            ("use_fused_kernels", use_fused_kernels),
            ("use_liger", use_liger),
            ("enable_activation_offload", enable_activation_offload),
        )
        if value
    ]
    if named:
        raise NotImplementedError(f"_build_model_optimizer: {', '.join(named)} not implemented; set them to false")


def build_engine(
    model_path: str,
    fsdp_config: Any,
    optim_config: Any,
    *,
    strategy: str = "fsdp",
    role: str = "actor",
    override_model_config: Any = None,
    enable_gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
    lora: Any = None,
    use_fused_kernels: bool = False,
    use_liger: bool = False,
    enable_activation_offload: bool = False,
) -> Any:
    """The engine of one role (``role`` "actor" or "ref"), its module and optimizer marked with it.

    An actor without ``optim_config`` (veRL builds one for a rollout-only worker) is forward-only.
    """
    _refuse(use_fused_kernels, use_liger, enable_activation_offload)
    if role not in ("actor", "ref"):
        raise ValueError(f"_build_model_optimizer(role={role!r}); use 'actor' or 'ref'")
    block = McoreEngineConfig if strategy == "megatron" else FSDPEngineConfig  # fsdp_config is the role's block
    engine_config = omega_conf_to_dataclass(fsdp_config if fsdp_config is not None else {}, block)
    if optim_config is None and not engine_config.forward_only:
        engine_config = dataclasses.replace(engine_config, forward_only=True)
    override = override_model_config
    if isinstance(override, DictConfig):
        override = OmegaConf.to_container(override, resolve=True)
    kwargs: dict[str, Any] = {}
    if role == "actor":
        kwargs = {"enable_gradient_checkpointing": enable_gradient_checkpointing, "lora": lora}
    engine = get_engine_class(strategy)(
        model_path,
        engine_config,
        optim_config,
        role=role,
        trust_remote_code=trust_remote_code,
        override_config=override or None,
        **kwargs,
    )
    attach_engine(engine.module, engine)
    if engine.optimizer is not None:
        attach_engine(engine.optimizer, engine)
    return engine


def legacy_handles(engine: Any) -> LegacyHandles:
    """What veRL's ``_build_model_optimizer`` returns: ``(module_fsdp, optimizer, lr_scheduler, hf_config)``, the
    module answering ``_fsdp_wrapped_module`` with itself (FSDP2 wraps nothing)."""
    module = engine.module
    object.__setattr__(module, "_fsdp_wrapped_module", module)  # not a registered submodule
    return module, engine.optimizer, engine.lr_scheduler, engine.model_config


def load_processing_class(path: str, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """``(tokenizer, processor)`` of the model folder ``path``, as veRL's worker loads them; the tokenizer is None
    (with a warning) when the folder has none."""
    from verl.utils.tokenizer import hf_processor, hf_tokenizer

    try:
        tokenizer = hf_tokenizer(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError) as error:
        logger.warning("no tokenizer in %s (%s): worker.tokenizer is None", path, error)
        return None, None
    return tokenizer, hf_processor(path, trust_remote_code=trust_remote_code)


def build_rollout(
    rollout_config: Any,
    model_path: str,
    *,
    device: str,
    lora: Any = None,
    verify_weight_sync: bool = False,
    in_process: bool = False,
) -> tuple[Any, Any]:
    """``(rollout engine, weight-sync engine)`` of ``rollout.name``; the rollout holds no weights until the first
    push. Without verification vLLM may pre-pack its CPU weights (faster; they can no longer be read back).
    ``in_process``: the pushes come from the actor in this process, so a backend between processes (``gloo``,
    ``nccl``, ``shm``: the run's pushes to rollout servers) gives way to ``naive`` for this engine."""
    from verl.checkpoint_engine import get_checkpoint_engine
    from verl.workers.rollout import get_rollout_class

    options: dict[str, Any] = {"readable_weights": verify_weight_sync} if rollout_config.name == "vllm" else {}
    if lora is not None:
        options["lora"] = lora
    rollout = get_rollout_class(rollout_config.name)(
        config=rollout_config, model_path=model_path, device=device, **options
    )
    engine_config = rollout_config.checkpoint_engine
    if in_process and engine_config.backend in ("gloo", "nccl", "shm"):
        engine_config = {
            "backend": "naive",
            "update_weights_bucket_megabytes": engine_config.update_weights_bucket_megabytes,
        }
    return rollout, get_checkpoint_engine(engine_config, dtype=rollout_config.dtype)


class LegacyWorkerAPI:
    """veRL's worker internals on ``ActorRolloutRefWorker`` (a mixin: it reads the worker's ``config``,
    ``model_config``, ``actor_config``, ``rollout_config``, ``lora`` and role flags), thin over the functions above.
    """

    def _init_legacy_attributes(self) -> None:
        """What veRL's ``__init__`` gives a recipe's ``init_model``: offload flags, the (size-1) Ulysses manager,
        the per-rank ``config.actor.ppo_mini_batch_size`` (see `verl.workers.fsdp_legacy`)."""
        self._is_offload_param, self._is_offload_optimizer = offload_flags(
            self.config, is_actor=self._is_actor, is_ref=self._is_ref
        )
        self.ulysses_sequence_parallel_size = 1
        self.ulysses_device_mesh = None
        self.ulysses_sharding_manager = FSDPUlyssesShardingManager(None)
        self.tokenizer: Any = None
        self.processor: Any = None
        self.flops_counter: FlopsCounter | None = None
        self.checkpoint_manager: FSDPCheckpointManager | None = None
        self._actor_has_dropout = False
        if self._is_actor and isinstance(self.config, DictConfig):
            normalize_batch_sizes(self.config, self.actor_config.ppo_mini_batch_size_per_rank)

    def _build_model_optimizer(
        self,
        model_path: str,
        fsdp_config: Any,
        optim_config: Any,
        override_model_config: Any = None,
        use_remove_padding: bool = False,
        use_fused_kernels: bool = False,
        enable_gradient_checkpointing: bool = False,
        trust_remote_code: bool = False,
        use_liger: bool = False,
        role: str = "actor",
        enable_activation_offload: bool = False,
    ) -> LegacyHandles:
        """veRL's: build ``role``'s ("actor" or "ref") model — our engine, recorded as ``actor_engine`` /
        ``ref_engine`` — and return ``(module_fsdp, optimizer, lr_scheduler, hf_config)``. Loads ``tokenizer`` /
        ``processor`` on first use. ``use_remove_padding`` is the actor config's switch and is not read here."""
        section = self.config.get(role, {}) or {}
        engine = build_engine(
            copy_to_local(model_path, use_shm=self.model_config.use_shm),
            fsdp_config,
            optim_config,
            strategy=section.get("strategy", "fsdp"),
            role=role,
            override_model_config=override_model_config,
            enable_gradient_checkpointing=enable_gradient_checkpointing,
            trust_remote_code=trust_remote_code,
            lora=self.lora if role == "actor" else None,
            use_fused_kernels=use_fused_kernels,
            use_liger=use_liger,
            enable_activation_offload=enable_activation_offload,
        )
        if role == "actor":
            self.actor_engine = engine
            self._actor_has_dropout = has_active_dropout(engine.module)
        else:
            self.ref_engine = engine
        if self.tokenizer is None:
            model = self.model_config
            self.tokenizer, self.processor = load_processing_class(
                copy_to_local(model.tokenizer_path or model.path, use_shm=model.use_shm), trust_remote_code
            )
        return legacy_handles(engine)

    def _build_rollout(self, trust_remote_code: bool = False) -> None:
        """veRL's: build the rollout engine and the weight-sync engine; with an actor here, push its weights as
        version 0."""
        model = self.model_config
        self.rollout, self.checkpoint_engine = build_rollout(
            self.rollout_config,
            copy_to_local(model.path, use_shm=model.use_shm),
            device=get_device_name(),
            lora=self.lora,
            verify_weight_sync=self.verify_weight_sync,
            in_process=self._is_actor,
        )
        if self._is_actor:
            self.update_weights(version=0)
