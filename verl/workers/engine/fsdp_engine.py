"""``FSDPEngine``: a Hugging Face model sharded with FSDP2 over all ranks, with its optimizer and lr schedule.

The engine owns the model, the optimizer and the schedule; the actor and critic workers own the losses and the
batching. A training step on every rank::

    engine.module.train()
    loss = loss_fn(engine.module(input_ids=..., attention_mask=...).logits, ...)   # this rank's micro-batches
    loss.backward()
    grad_norm = engine.clip_grad_norm_and_step()   # same value on every rank
    lr = engine.lr_scheduler_step()

A no-grad pass goes through ``with engine.eval_mode():`` (it reshards the parameters at the end). Inputs go on
``engine.device``. With ``fsdp_config.param_offload`` / ``optimizer_offload`` the engine starts offloaded; call
``load_params()`` (and ``load_optimizer()`` before a step) first and ``offload_*()`` afterwards. The same code runs
on CPU with gloo and on CUDA with nccl: the device and backend come from ``verl.utils.device``; on a CPU device the
offload calls do nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import torch.distributed as dist

from verl.base_config import omega_conf_to_dataclass
from verl.utils.device import get_device_name, get_torch_device, warn_if_bf16_is_emulated
from verl.utils.torch_dtypes import to_torch_dtype
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig
from verl.workers.engine import checkpoint, offload
from verl.workers.engine.base import eval_no_grad
from verl.workers.engine.full_state import hf_name, iter_full_tensors
from verl.workers.engine.hf_folder import HF_FOLDER, check_same_model, save_hf_folder
from verl.workers.engine.hf_model import FORWARD_ONLY_ROLES, ROLES, VALUE_MODEL_ROLES, load_hf_model
from verl.workers.engine.lora import (
    ADAPTER_FOLDER,
    LoraSpec,
    apply_lora,
    is_adapter_name,
    lora_module_names,
    merge_lora_stream,
    save_adapter_folder,
    sync_name,
)
from verl.workers.engine.lr_schedule import build_lr_scheduler
from verl.workers.engine.optim import build_optimizer, clip_grad_norm_and_step
from verl.workers.engine.registry import register_engine
from verl.workers.engine.sharding import (
    apply_fsdp2,
    build_device_mesh,
    mixed_precision_policy,
    plain_module,
    reshard_all,
)

__all__ = ["FSDPEngine"]

logger = logging.getLogger(__name__)


def _enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Non-reentrant activation checkpointing of every decoder layer (transformers' own mechanism)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x; the old name warns there
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


@register_engine("fsdp", "fsdp2")
class FSDPEngine:
    """A model loaded from a Hugging Face folder, sharded with FSDP2, plus AdamW and an lr schedule.

    Args:
        model_path: Hugging Face model folder (``config.json`` + weights).
        engine_config: ``fsdp_config`` (an ``FSDPEngineConfig`` or a mapping of its fields).
        optim_config: ``optim`` (an ``FSDPOptimizerConfig`` or a mapping); needed unless the engine is forward-only.
        role: "actor" or "ref" load a causal LM; "critic" or "reward_model" a value model (LM backbone + a scalar
            head: ``logits`` of shape (B, T, 1)). "ref" and "reward_model" engines are forward-only (no optimizer,
            parameters frozen), as is any engine with ``fsdp_config.forward_only``.
        enable_gradient_checkpointing: recompute each decoder layer's activations in backward.
        trust_remote_code: passed to transformers.
        override_config: attributes set on the model's HF config before loading.
        attn_implementation: transformers attention backend (None: transformers' default).
        lora: LoRA adapters to put on the model (`verl.workers.engine.lora`): only they (and a value model's head)
            train; ``adapters_disabled()`` gives the base model; weights stream under sync names, exports merge.

    Needs the default process group (``verl.utils.distributed.initialize_global_process_group``); every rank builds
    the engine and calls its collective methods together.
    """

    def __init__(
        self,
        model_path: str,
        engine_config: FSDPEngineConfig | Mapping[str, Any],
        optim_config: FSDPOptimizerConfig | Mapping[str, Any] | None = None,
        *,
        role: str = "actor",
        enable_gradient_checkpointing: bool = False,
        trust_remote_code: bool = False,
        override_config: Mapping[str, Any] | None = None,
        attn_implementation: str | None = None,
        lora: LoraSpec | None = None,
    ) -> None:
        self.engine_config: FSDPEngineConfig = omega_conf_to_dataclass(engine_config, FSDPEngineConfig)
        self.optim_config: FSDPOptimizerConfig | None = omega_conf_to_dataclass(optim_config, FSDPOptimizerConfig)
        cfg = self.engine_config
        if role not in ROLES:
            raise ValueError(f"role={role!r}; use one of {list(ROLES)}")
        self.forward_only = cfg.forward_only or role in FORWARD_ONLY_ROLES
        if not self.forward_only and self.optim_config is None:
            raise ValueError("an FSDPEngine that trains needs optim_config (or set fsdp_config.forward_only=true)")
        device_name = get_device_name()
        if cfg.offload_policy and device_name == "cpu":
            raise ValueError(
                "fsdp_config.offload_policy=true uses FSDP2's CPUOffloadPolicy, which needs an accelerator and is "
                "not supported on CPU: set offload_policy=false and use param_offload/optimizer_offload instead (on "
                "a CPU device they do nothing, the shards already live in host memory)"
            )
        if not dist.is_initialized():
            raise RuntimeError(
                "FSDPEngine needs the default process group: call "
                "verl.utils.distributed.initialize_global_process_group() on every rank first"
            )
        if cfg.full_determinism:
            from transformers import enable_full_determinism

            enable_full_determinism(cfg.seed)

        self.role = role
        self.is_value_model = role in VALUE_MODEL_ROLES
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        if device_name == "cpu":
            self.device = torch.device("cpu")
        else:
            self.device = torch.device(device_name, get_torch_device().current_device())
        self.device_mesh = build_device_mesh(device_name, cfg.fsdp_size)

        model = load_hf_model(
            model_path,
            value_model=self.is_value_model,
            dtype=to_torch_dtype(cfg.model_dtype),
            seed=cfg.seed,
            trust_remote_code=trust_remote_code,
            override_config=override_config,
            attn_implementation=attn_implementation,
        )
        self.model_config = model.config
        self.model_path = model_path
        if enable_gradient_checkpointing:
            _enable_activation_checkpointing(model)
        self.lora = lora
        self.lora_modules: set[str] = set()
        if lora is not None:
            model = apply_lora(model, lora, value_model=self.is_value_model, seed=cfg.seed)
            self.lora_modules = lora_module_names(model.state_dict())
        if self.forward_only:
            model.requires_grad_(False)
        # one rank: FSDP2 would only copy; a plain module gives the same results (autocast for mixed precision)
        self.sharded = self.world_size > 1 or not cfg.plain_single_rank or cfg.offload_policy
        self.module = (
            apply_fsdp2(model, self.device_mesh, cfg) if self.sharded else plain_module(model, self.device, cfg)
        )
        self.module.train(not self.forward_only)
        policy = mixed_precision_policy(cfg)
        compute = policy.param_dtype if policy is not None else to_torch_dtype(cfg.model_dtype)
        warn_if_bf16_is_emulated(compute, self.device, "the training engine (fsdp_config.dtype)")

        self.optimizer: torch.optim.Optimizer | None = None
        self.lr_scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if not self.forward_only:
            trainable = [p for p in self.module.parameters() if p.requires_grad]
            self.optimizer = build_optimizer(trainable, self.optim_config)
            self.lr_scheduler = build_lr_scheduler(self.optimizer, self.optim_config)

        self._params_offloaded = False
        self._optimizer_offloaded: list[tuple[torch.nn.Parameter, str, torch.device]] | None = None
        self._logged_cpu_offload = False
        if cfg.param_offload:
            self.offload_params()
        if cfg.optimizer_offload:
            self.offload_optimizer()

    # ------------------------------------------------------------------ training
    def _require_optimizer(self, what: str) -> torch.optim.Optimizer:
        if self.optimizer is None:
            raise RuntimeError(f"{what} needs an optimizer, but this engine is forward-only (role={self.role!r})")
        return self.optimizer

    def zero_grad(self) -> None:
        """Drop all gradients (``set_to_none``)."""
        self._require_optimizer("zero_grad").zero_grad(set_to_none=True)

    def clip_grad_norm_and_step(self, max_norm: float | None = None) -> float:
        """Clip the gradients to ``max_norm`` (default ``optim.clip_grad``), step the optimizer, clear the gradients.

        Returns the total gradient norm before clipping (the same on every rank). When it is NaN or infinite the
        step is skipped (a warning is logged) and the gradients are cleared all the same; the norm is still returned
        so callers can count such steps. Does not step the lr schedule (see ``lr_scheduler_step``). With manual
        offload, call ``load_params()`` and ``load_optimizer()`` first.
        """
        optimizer = self._require_optimizer("clip_grad_norm_and_step")
        max_norm = self.optim_config.clip_grad if max_norm is None else max_norm
        return clip_grad_norm_and_step(self.module, optimizer, max_norm)

    def lr_scheduler_step(self) -> float:
        """Advance the lr schedule by one step; returns the lr the next optimizer step will use."""
        self._require_optimizer("lr_scheduler_step")
        self.lr_scheduler.step()
        return self.get_lr()

    def get_lr(self) -> float:
        """The learning rate the next optimizer step will use."""
        return float(self._require_optimizer("get_lr").param_groups[0]["lr"])

    def eval_mode(self) -> contextlib.AbstractContextManager[None]:
        """Forward passes without autograd: ``module.eval()`` and ``torch.no_grad()`` inside; on exit the parameters
        are resharded (else the next optimizer state dict fails) and the training flag is restored."""
        return eval_no_grad(self.module, reshard_all)

    # ------------------------------------------------------------------ offload
    def _cpu_offload_noop(self, what: str) -> bool:
        """True (after logging once) when offloading means nothing: a CPU device, or FSDP2's own offload policy."""
        if self.device.type != "cpu" and not self.engine_config.offload_policy:
            return False
        if not self._logged_cpu_offload:
            reason = "the device is the CPU" if self.device.type == "cpu" else "CPUOffloadPolicy keeps the shards there"
            logger.info("%s and the other offload calls do nothing: %s", what, reason)
            self._logged_cpu_offload = True
        return True

    def offload_params(self) -> None:
        """Move the parameter shards (and gradients) to host memory. No-op on a CPU device."""
        if self._cpu_offload_noop("offload_params") or self._params_offloaded:
            return
        offload.move_module(self.module, "cpu")
        get_torch_device().empty_cache()
        self._params_offloaded = True

    def load_params(self) -> None:
        """Bring the parameter shards back to the device. No-op on a CPU device."""
        if self._cpu_offload_noop("load_params") or not self._params_offloaded:
            return
        offload.move_module(self.module, self.device)
        self._params_offloaded = False

    def offload_optimizer(self) -> None:
        """Move the optimizer state to host memory. No-op on a CPU device or for a forward-only engine."""
        if (
            self.optimizer is None
            or self._cpu_offload_noop("offload_optimizer")
            or self._optimizer_offloaded is not None
        ):
            return
        self._optimizer_offloaded = offload.offload_optimizer_state(self.optimizer)
        get_torch_device().empty_cache()

    def load_optimizer(self) -> None:
        """Bring the optimizer state back to the device. No-op on a CPU device."""
        if self.optimizer is None or self._cpu_offload_noop("load_optimizer") or self._optimizer_offloaded is None:
            return
        offload.load_optimizer_state(self.optimizer, self._optimizer_offloaded)
        self._optimizer_offloaded = None

    @contextlib.contextmanager
    def on_device(self, optimizer: bool = True) -> Iterator[None]:
        """Temporarily load offloaded parameters (and, with ``optimizer``, the optimizer state) onto the device, and
        offload them again after: around every forward, update, checkpoint and weight export. Nothing to do when
        nothing is offloaded (always the case on CPU)."""
        params, optim = self._params_offloaded, optimizer and self._optimizer_offloaded is not None
        if params:
            self.load_params()
        if optim:
            self.load_optimizer()
        try:
            yield
        finally:
            if params:
                self.offload_params()
            if optim:
                self.offload_optimizer()

    # ------------------------------------------------------------------ weights
    def adapters_disabled(self) -> contextlib.AbstractContextManager[None]:
        """Inside, the model is its base model (LoRA adapters bypassed): the reference policy of a LoRA actor."""
        if self.lora is None:
            raise RuntimeError(f"adapters_disabled on an engine without LoRA (role={self.role!r})")
        return self.module.disable_adapter()

    def iter_full_state_dict(
        self, dtype: torch.dtype | None = None, bucket_bytes: int | None = None, *, adapters_only: bool = False
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield ``(name, full tensor)`` for every entry of the model's state dict, on every rank: what a weight
        push sends.

        Names are the Hugging Face model's ``state_dict()`` keys; with LoRA they are the sync names of
        `verl.workers.engine.lora` (base weights under their HF names, adapters under peft's file names), and
        ``adapters_only`` gathers the adapters alone. Tensors are on the engine's device, cast to ``dtype`` if given;
        on one rank they may be views of the parameters (copy what you keep). ``bucket_bytes`` gathers several shards
        per collective (see ``verl.workers.engine.full_state.iter_full_tensors``). All ranks must consume the
        iterator to its end.
        """
        if adapters_only and self.lora is None:
            raise ValueError("iter_full_state_dict(adapters_only=True) on an engine without LoRA")
        with self.on_device():
            reshard_all(self.module)
            state = self.module.state_dict()
            if self.lora is not None:
                names = {key: sync_name(hf_name(key)) for key in state}
                state = {
                    names[key]: tensor
                    for key, tensor in state.items()
                    if names[key] is not None and (not adapters_only or is_adapter_name(names[key]))
                }
            yield from iter_full_tensors(state, dtype=dtype, bucket_bytes=bucket_bytes)

    def iter_hf_state_dict(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The model as a plain Hugging Face state dict: ``iter_full_state_dict`` with LoRA adapters merged into
        their weights (``W + alpha/r · B @ A``). Every rank must consume it."""
        tensors = self.iter_full_state_dict(dtype=dtype)
        if self.lora is None:
            yield from tensors
            return
        yield from merge_lora_stream(tensors, self.lora_modules, self.lora.scaling)

    def get_full_state_dict(
        self, dtype: torch.dtype | None = None, device: torch.device | str | None = "cpu"
    ) -> dict[str, torch.Tensor]:
        """The full Hugging Face state dict (adapters merged) on every rank, moved to ``device`` (None: leave on the
        engine's device); a snapshot, never a view of the parameters."""
        return {
            name: tensor.to(tensor.device if device is None else device, copy=True)
            for name, tensor in self.iter_hf_state_dict(dtype=dtype)
        }

    def get_adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA adapters (sync names, CPU copies) on every rank."""
        return {name: t.to("cpu", copy=True) for name, t in self.iter_full_state_dict(adapters_only=True)}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str, hf_weights: bool = False, tokenizer_path: str | None = None) -> None:
        """Save model + optimizer shards with torch.distributed.checkpoint, the lr schedule and every rank's random
        states under ``path``, and a Hugging Face folder under ``path/huggingface``: the model config (and the
        tokenizer of ``tokenizer_path``) always, the full weights too with ``hf_weights``."""
        extra: dict[str, Any] = {"lora": self._lora_record()}
        if self.lr_scheduler is not None:
            extra["lr_scheduler"] = self.lr_scheduler.state_dict()
        with self.on_device():
            reshard_all(self.module)
            checkpoint.save_sharded(path, self.module, self.optimizer, extra)
        full_state: dict[str, torch.Tensor] | None = {} if hf_weights else None
        if full_state is not None:  # a collective: every rank takes part, only rank 0 keeps the full tensors
            for name, tensor in self.iter_hf_state_dict():
                if self.rank == 0:
                    full_state[name] = tensor.to("cpu")
        if self.lora is not None:  # the adapters in peft's format, as veRL writes them (a collective too)
            adapters = self.get_adapter_state_dict()
            if self.rank == 0:
                folder = os.path.join(path, ADAPTER_FOLDER)
                save_adapter_folder(folder, self.lora, adapters, self.model_path, value_model=self.is_value_model)
        if self.rank == 0:
            folder = os.path.join(path, HF_FOLDER)
            save_hf_folder(folder, self.model_config, tokenizer_path, full_state, is_value_model=self.is_value_model)
        dist.barrier()

    def _lora_record(self) -> dict[str, Any] | None:
        """What a checkpoint records of the LoRA setup (None without LoRA); a resume must match it."""
        if self.lora is None:
            return None
        spec = self.lora
        return {
            "rank": spec.rank,
            "alpha": spec.alpha,
            "target_modules": spec.target_modules,
            "exclude": spec.exclude_modules,
        }

    def load_checkpoint(self, path: str) -> None:
        """Load what ``save_checkpoint`` wrote (any world size). Raises FileNotFoundError / ValueError naming a
        missing or corrupt file."""
        extra = checkpoint.read_extra_state(path)
        check_same_model(os.path.join(path, HF_FOLDER), self.model_config)
        saved_lora, ours = extra.get("lora"), self._lora_record()
        if saved_lora != ours:
            raise ValueError(
                f"the checkpoint {path} was trained with LoRA {saved_lora}, this run's {self.role} has LoRA {ours} "
                "(lora_rank / lora_alpha / target_modules / exclude_modules must match to resume)"
            )
        if self.optimizer is not None:
            if not checkpoint.has_optimizer_state(path):
                raise ValueError(f"checkpoint {path} has no optimizer state (saved by a forward-only engine?)")
            if "lr_scheduler" not in extra:
                raise ValueError(f"checkpoint {path} has no lr-scheduler state; {checkpoint.EXTRA_STATE_FILE} lacks it")
        with self.on_device():
            reshard_all(self.module)
            checkpoint.load_sharded(path, self.module, self.optimizer)
        if self.lr_scheduler is not None:
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        checkpoint.load_rng_state(path, int(extra.get("world_size", 0)))
        logger.info("loaded %s (written by %s ranks, loaded by %d)", path, extra.get("world_size"), self.world_size)
