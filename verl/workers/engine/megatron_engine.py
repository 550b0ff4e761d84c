"""``MegatronEngine``: a Hugging Face Qwen2 / Llama model trained by Megatron-Core with tensor, pipeline and data
parallelism (``strategy: megatron``, veRL's ``actor_rollout_ref.actor.megatron.*``).

Every rank builds its stage of a ``GPTModel`` (Megatron's local layer spec) and loads its shard of the HF weights
(`verl.models.mcore.weight_converter`). Micro-batches run through Megatron's pipeline schedule
(:meth:`MegatronEngine.forward_backward`): the caller gives the loss of one micro-batch from its logits, which only
the last stage computes. Gradients are reduced by Megatron's ``DistributedDataParallel``; the optimizer is
Megatron's (``use_distributed_optimizer`` shards its state over the data-parallel ranks).

On a machine without CUDA the engine applies `verl.utils.megatron.cpu_layer` and runs over gloo, in fp32 or bf16.
The ranks of a worker group are laid out as Megatron's: tensor-parallel ranks adjacent, then context, then data,
then pipeline; :attr:`dp_rank` / :attr:`dp_size` / :attr:`dp_group` are the data-parallel place a batch shard
follows, and :attr:`is_collect_rank` (tp rank 0 of the last stage) the rank whose results count.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from verl.base_config import omega_conf_to_dataclass
from verl.models.mcore.config_converter import SUPPORTED_MODEL_TYPES
from verl.models.mcore.model_builder import build_gpt_stage, build_transformer_config
from verl.models.mcore.weight_converter import hf_to_mcore, layout_of, mcore_to_hf
from verl.utils.torch_dtypes import to_torch_dtype
from verl.workers.config.engine import McoreEngineConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig
from verl.workers.engine.base import eval_no_grad
from verl.workers.engine.hf_folder import HF_FOLDER, check_same_model, save_hf_folder
from verl.workers.engine.hf_model import FORWARD_ONLY_ROLES, ROLES, VALUE_MODEL_ROLES
from verl.workers.engine.lr_schedule import LR_SCHEDULES, resolve_warmup_steps
from verl.workers.engine.megatron_inputs import McoreInputs
from verl.workers.engine.megatron_setup import (
    init_model_parallel,
    megatron_rank_layout,
    refuse_unbuilt,
    refuse_unread_optim,
    safetensors_getter,
)
from verl.workers.engine.registry import register_engine

__all__ = ["MegatronEngine"]

logger = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, Any], tuple[torch.Tensor, dict[str, Any]]]


@register_engine("megatron")
class MegatronEngine:
    """A model loaded from a Hugging Face folder into Megatron-Core, with Megatron's DDP and optimizer.

    Args:
        model_path: Hugging Face model folder (``config.json`` + safetensors).
        engine_config: the role's ``megatron`` block (an ``McoreEngineConfig`` or a mapping of its fields).
        optim_config: the role's ``optim`` (an ``McoreOptimizerConfig`` / ``FSDPOptimizerConfig`` or mapping).
        role: "actor" / "ref" (a causal LM) or "critic" / "reward_model" (a value head on the backbone); "ref" and
            "reward_model" are forward-only.
        override_config: attributes set on the HF config before the model is built.
        enable_gradient_checkpointing: recompute each layer's activations in backward (Megatron's full recompute).

    Needs the default process group; every rank builds the engine and calls its collective methods together.
    """

    def __init__(
        self,
        model_path: str,
        engine_config: McoreEngineConfig | Mapping[str, Any],
        optim_config: FSDPOptimizerConfig | Mapping[str, Any] | None = None,
        *,
        role: str = "actor",
        override_config: Mapping[str, Any] | None = None,
        enable_gradient_checkpointing: bool = False,
        trust_remote_code: bool = False,
        lora: Any = None,
    ) -> None:
        from transformers import AutoConfig

        from verl.utils.megatron.cpu_layer import apply_cpu_layer, check_megatron_core_version

        self.engine_config: McoreEngineConfig = omega_conf_to_dataclass(engine_config, McoreEngineConfig)
        self.optim_config = omega_conf_to_dataclass(optim_config, FSDPOptimizerConfig) if optim_config else None
        cfg = self.engine_config
        if role not in ROLES:
            raise ValueError(f"role={role!r}; use one of {list(ROLES)}")
        if lora is not None:
            raise ValueError("megatron engine: LoRA is not built for Megatron here (use strategy fsdp for LoRA)")
        refuse_unbuilt(cfg)
        if not dist.is_initialized():
            raise RuntimeError("MegatronEngine needs the default process group on every rank")
        check_megatron_core_version()
        apply_cpu_layer()
        init_model_parallel(cfg)
        from megatron.core import parallel_state as mpu
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(cfg.seed)
        if cfg.full_determinism:
            torch.use_deterministic_algorithms(True)
        self.role = role
        self.is_value_model = role in VALUE_MODEL_ROLES
        self.forward_only = cfg.forward_only or role in FORWARD_ONLY_ROLES
        if not self.forward_only and self.optim_config is None:
            raise ValueError("a MegatronEngine that trains needs optim_config (or set megatron.forward_only=true)")
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
        self.device = self.device or torch.device("cpu")
        self.tp_rank, self.tp_size = mpu.get_tensor_model_parallel_rank(), mpu.get_tensor_model_parallel_world_size()
        self.pp_rank = mpu.get_pipeline_model_parallel_rank()
        self.pp_size = mpu.get_pipeline_model_parallel_world_size()
        self.dp_rank, self.dp_size = mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
        self.dp_group = mpu.get_data_parallel_group()
        self.is_first_stage, self.is_last_stage = self.pp_rank == 0, self.pp_rank == self.pp_size - 1
        self.is_collect_rank = self.tp_rank == 0 and self.is_last_stage
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        expected = megatron_rank_layout(self.rank, self.world_size, self.tp_size, self.pp_size)
        if expected != (self.tp_rank, self.dp_rank, self.pp_rank, self.dp_size):
            raise RuntimeError(
                f"megatron engine: rank {self.rank} is {expected} by our layout, Megatron says otherwise"
            )

        hf_config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        for key, value in (override_config or {}).items():
            setattr(hf_config, key, value)
        if hf_config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"megatron engine: model_type {hf_config.model_type!r} of {model_path} has no converter; "
                f"supported: {sorted(SUPPORTED_MODEL_TYPES)}"
            )
        self.model_config = hf_config
        self.model_path = model_path
        self.dtype = to_torch_dtype(cfg.dtype)
        parallel = {
            "tensor_model_parallel_size": self.tp_size,
            "pipeline_model_parallel_size": self.pp_size,
            "sequence_parallel": cfg.sequence_parallel and self.tp_size > 1,
        }
        if enable_gradient_checkpointing:
            parallel.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
        self.transformer_config = build_transformer_config(
            hf_config, parallel, self.dtype, dict(cfg.override_transformer_config)
        )
        self.layout = layout_of(hf_config, self.tp_size, self.pp_size, value_model=self.is_value_model)
        if hf_config.vocab_size % self.tp_size:
            raise ValueError(
                f"megatron engine: vocab_size {hf_config.vocab_size} does not split over "
                f"tensor_model_parallel_size={self.tp_size}"
            )
        model = build_gpt_stage(
            hf_config,
            self.transformer_config,
            pre_process=self.is_first_stage,
            post_process=self.is_last_stage,
            value_model=self.is_value_model,
        )
        self._load_hf_weights(model, model_path)
        model.to(self.device)
        self._unwrapped = model  # the GPTModel stage: its state dict is what the converter reads and writes
        if self.dtype != torch.float32:
            from megatron.core.transformer.module import Float16Module

            # Megatron's mixed precision: bf16/fp16 parameters and activations, fp32 logits out of the last stage
            # (the optimizer keeps fp32 main copies of the parameters)
            model = Float16Module(self.transformer_config, model)
        self.optimizer = None
        # the optimizer steps fp32 main copies of bf16 / fp16 parameters: writing the parameters alone (a snapshot
        # restored) would be undone by the next step
        self.keeps_main_params = self.dtype != torch.float32 and not self.forward_only
        self.lr_scheduler = None  # the schedule is the engine's own (lr_scheduler_step); no torch scheduler object
        self._lr_lambda: Callable[[int], float] | None = None
        self._lr_step = 0
        if self.forward_only:
            model.requires_grad_(False)
            self.module = model
        else:
            from megatron.core.distributed import finalize_model_grads

            self.module = self._wrap_ddp(model)
            self.optimizer = self._build_optimizer()
            # what Megatron's training loop sets: after the last micro-batch's backward the schedule reduces the
            # gradients over data-parallel ranks (and the tied / sequence-parallel ones over their groups), and
            # fp16's loss scale multiplies each micro-batch's loss
            self.transformer_config.finalize_model_grads_func = finalize_model_grads
            self.transformer_config.grad_scale_func = self.optimizer.scale_loss

    # ------------------------------------------------------------------ building
    def _load_hf_weights(self, model: torch.nn.Module, model_path: str) -> None:
        get, stack = safetensors_getter(model_path)
        with stack:
            if self.is_value_model and self.is_last_stage:
                try:
                    get("score.weight")
                except KeyError:  # a causal LM's folder: the value head starts fresh, as transformers starts it
                    generator = torch.Generator().manual_seed(self.engine_config.seed)
                    head = {
                        "score.weight": torch.empty(1, self.model_config.hidden_size).normal_(
                            0.0, self.transformer_config.init_method_std, generator=generator
                        ),
                        "score.bias": torch.zeros(1),
                    }
                    base = get
                    get = lambda name: head[name] if name in head else base(name)  # noqa: E731
            state = hf_to_mcore(get, self.layout, self.tp_rank, self.pp_rank)
        own = {k for k in model.state_dict() if not k.endswith("_extra_state")}
        missing, extra = sorted(own - set(state)), sorted(set(state) - own)
        if missing or extra:
            raise RuntimeError(f"megatron engine: weight conversion mismatch: missing {missing[:5]}, extra {extra[:5]}")
        with torch.no_grad():
            params = dict(model.state_dict())
            for name, tensor in state.items():
                params[name].copy_(tensor.to(params[name].dtype))

    def _wrap_ddp(self, model: torch.nn.Module) -> torch.nn.Module:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        cfg = self.engine_config
        ddp_kwargs = {
            "grad_reduce_in_fp32": True,
            "overlap_grad_reduce": False,
            "use_distributed_optimizer": cfg.use_distributed_optimizer,
            **cfg.override_ddp_config,
        }
        return DistributedDataParallel(
            config=self.transformer_config, ddp_config=DistributedDataParallelConfig(**ddp_kwargs), module=model
        )

    def _build_optimizer(self) -> Any:
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        optim = self.optim_config
        refuse_unread_optim(optim)
        name = getattr(optim, "optimizer", "adam").lower()
        name = {"adamw": "adam"}.get(name, name)
        if name not in ("adam", "sgd"):
            raise ValueError(f"megatron engine: optim.optimizer={optim.optimizer!r}; use adam or sgd")
        style = getattr(optim, "lr_decay_style", "constant")
        schedule = {"constant": optim.lr_scheduler_type, "cosine": "cosine"}.get(style)
        if schedule not in LR_SCHEDULES:
            raise ValueError(f"megatron engine: optim.lr_decay_style={style!r} is not built; use constant or cosine")
        config = OptimizerConfig(
            optimizer=name,
            lr=optim.lr,
            weight_decay=optim.weight_decay,
            adam_beta1=optim.betas[0],
            adam_beta2=optim.betas[1],
            clip_grad=0.0,  # clip_grad_norm_and_step clips with the norm it returns
            bf16=self.dtype == torch.bfloat16,
            fp16=self.dtype == torch.float16,
            params_dtype=self.dtype,
            use_distributed_optimizer=self.engine_config.use_distributed_optimizer,
        )
        optimizer = get_megatron_optimizer(config, [self.module])
        self._lr_lambda = LR_SCHEDULES[schedule](optim, resolve_warmup_steps(optim))
        self._set_lr(optimizer, self._lr_lambda(0))
        return optimizer

    def _set_lr(self, optimizer: Any, factor: float) -> None:
        for group in optimizer.param_groups:
            group["lr"] = self.optim_config.lr * factor

    # ------------------------------------------------------------------ forward / backward
    def forward_backward(
        self,
        micro_batches: Sequence[Mapping[str, torch.Tensor]],
        loss_fn: LossFn,
        *,
        forward_only: bool = False,
    ) -> list[dict[str, Any]]:
        """Run ``micro_batches`` (each with ``input_ids``, ``attention_mask``, ``position_ids``, (bs, s)) through the
        pipeline schedule; on the last stage ``loss_fn(logits, micro_batch)`` (logits (bs, s, vocab) in the batch's
        layout, values (bs, s, 1) for a value model) gives the micro-batch's loss (its share of the whole update) and
        a dict of results. Returns those dicts, in order, on the last stage ([] elsewhere). Gradients accumulate
        (and are reduced over data-parallel ranks) unless ``forward_only``."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        count = len(micro_batches)
        if count == 0:
            return []
        multiple = self.tp_size if self.transformer_config.sequence_parallel else 1
        iterator = iter(micro_batches)

        def step(data_iterator: Iterator[Any], model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
            micro = next(data_iterator)
            inputs = McoreInputs.from_batch(
                micro["input_ids"].to(self.device),
                micro["attention_mask"].to(self.device),
                micro["position_ids"].to(self.device),
                multiple,
            )
            output = model(inputs.input_ids, inputs.position_ids, inputs.attention_mask)

            def loss(output_tensor: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
                value, results = loss_fn(inputs.restore(output_tensor), micro)
                # the schedule divides each micro-batch's loss by their count; ours are already shares
                return value * count, results

            return output, loss

        # with variable_seq_lengths the stages exchange each micro-batch's shape: these two only size the first
        seq = -(-max(int(m["input_ids"].shape[1]) for m in micro_batches) // multiple) * multiple
        bs = max(int(m["input_ids"].shape[0]) for m in micro_batches)
        context = torch.no_grad() if forward_only else contextlib.nullcontext()
        with context:
            results = get_forward_backward_func()(
                forward_step_func=step,
                data_iterator=iterator,
                model=[self.module],
                num_microbatches=count,
                seq_length=seq,
                micro_batch_size=bs,
                forward_only=forward_only,
            )
        return list(results) if self.is_last_stage else []

    def share_from_last_stage(self, obj: Any) -> Any:
        """``obj`` as the last pipeline stage holds it, on every stage (a no-op without pipeline stages)."""
        if self.pp_size == 1:
            return obj
        from megatron.core import parallel_state as mpu

        group = mpu.get_pipeline_model_parallel_group()
        holder = [obj if self.is_last_stage else None]
        dist.broadcast_object_list(holder, src=dist.get_global_rank(group, self.pp_size - 1), group=group)
        return holder[0]

    def zero_grad(self) -> None:
        """Drop the accumulated gradients."""
        if self.optimizer is not None:
            self.module.zero_grad_buffer()
            self.optimizer.zero_grad()

    def clip_grad_norm_and_step(self, max_norm: float | None = None) -> float:
        """The norm of the accumulated gradients over all ranks; unless it is NaN or infinite (then the step is
        skipped and a warning logged), clip to ``max_norm`` (None or ≤ 0: no clip) and step; the gradients cleared."""
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        if self.optimizer is None:
            raise RuntimeError(f"clip_grad_norm_and_step needs an optimizer; this {self.role} engine is forward-only")
        found_inf = self.optimizer.prepare_grads()
        norm = float(self.optimizer.get_grad_norm())
        if found_inf or not math.isfinite(norm):
            logger.warning("megatron engine: gradient norm is %s; the step is skipped", norm)
        else:
            if max_norm is not None and max_norm > 0:
                for optimizer in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
                    params = optimizer.get_parameters()
                    if params:
                        clip_grad_by_total_norm_fp32(params, max_norm=max_norm, total_norm=norm)
            self.optimizer.step_with_ready_grads()
        self.zero_grad()
        return norm

    def lr_scheduler_step(self) -> float:
        """Advance the schedule one step; the new learning rate."""
        self._lr_step += 1
        self._set_lr(self.optimizer, self._lr_lambda(self._lr_step))
        return self.get_lr()

    def get_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    def eval_mode(self) -> contextlib.AbstractContextManager[None]:
        """``eval()`` and no grad inside; the training flag restored on exit."""
        return eval_no_grad(self.module, lambda module: None)

    @contextlib.contextmanager
    def on_device(self, optimizer: bool = True) -> Iterator[None]:
        """Parameters (and optimizer state) where the engine computes; on this engine always so (the offload keys
        are refused where they would do something)."""
        yield

    # ------------------------------------------------------------------ weights out
    def iter_full_state_dict(
        self, dtype: torch.dtype | None = None, bucket_bytes: int | None = None, *, adapters_only: bool = False
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """``(HF name, full tensor)`` of the whole model on every rank: each stage's tensor-parallel shards are
        gathered, then each stage's tensors are broadcast from its tp rank 0 to every rank. All ranks must consume
        the iterator to its end. (``bucket_bytes`` is accepted for the FSDP engine's signature: one collective per
        stage here.)"""
        from megatron.core import parallel_state as mpu

        if adapters_only:
            raise ValueError("iter_full_state_dict(adapters_only=True): the megatron engine has no LoRA")
        local = {k: v.detach() for k, v in self._unwrapped.state_dict().items() if not k.endswith("_extra_state")}
        tp_group = mpu.get_tensor_model_parallel_group()
        gathered: list[dict[str, torch.Tensor]] = [None] * self.tp_size  # type: ignore[list-item]
        dist.all_gather_object(gathered, {k: v.cpu() for k, v in local.items()}, group=tp_group)
        for stage in range(self.pp_size):
            tensors = list(mcore_to_hf(gathered, self.layout, stage)) if stage == self.pp_rank else None
            if self.pp_size > 1:
                group, holder = mpu.get_pipeline_model_parallel_group(), [tensors]
                dist.broadcast_object_list(holder, src=dist.get_global_rank(group, stage), group=group)
                tensors = holder[0]
            for name, tensor in tensors:
                yield name, tensor.to(dtype) if dtype is not None else tensor

    def iter_hf_state_dict(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The model as a Hugging Face state dict (no adapters to merge here)."""
        return self.iter_full_state_dict(dtype=dtype)

    def get_full_state_dict(self, dtype: torch.dtype | None = None, device: Any = "cpu") -> dict[str, torch.Tensor]:
        """The full Hugging Face state dict on every rank (copies)."""
        return {name: t.to(device or t.device, copy=True) for name, t in self.iter_full_state_dict(dtype=dtype)}

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str, hf_weights: bool = False, tokenizer_path: str | None = None) -> None:
        """Each rank's model and optimizer state and its random states under ``path/mp_rank_XX_YYY_ZZZ.pt``
        (tp, pp, dp), the schedule's step; ``path/huggingface`` holds the config and tokenizer, and the full weights
        with ``hf_weights``. Resuming needs the same layout."""
        from megatron.core import tensor_parallel

        os.makedirs(path, exist_ok=True)
        state = {
            "model": self._unwrapped.state_dict(),
            "optimizer": self._optimizer_state() if self.optimizer is not None else None,
            "lr_step": self._lr_step,
            "rng": {
                "torch": torch.get_rng_state(),
                "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
            },
            "layout": [self.tp_size, self.pp_size, self.dp_size],
        }
        torch.save(state, self._shard_file(path))
        full = self.get_full_state_dict() if hf_weights else None
        if self.rank == 0:
            save_hf_folder(
                os.path.join(path, HF_FOLDER),
                self.model_config,
                tokenizer_path or self.model_path,
                full,
                is_value_model=self.is_value_model,
            )
        dist.barrier()

    def _optimizers(self) -> list[Any]:
        return list(getattr(self.optimizer, "chained_optimizers", [self.optimizer]))

    def _optimizer_state(self) -> list[dict[str, Any]]:
        """Each of Megatron's optimizers' state on this rank. A distributed optimizer's ``state_dict()`` leaves out
        the state of its parameter shard (Megatron gathers that to dp rank 0 in a CUDA-only path), so this rank's
        shard is saved as it is: the inner torch optimizer's state and the fp32 main copies of low-precision
        parameters (fp32 parameters are the model's own, saved with it)."""
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

        states = []
        for optimizer in self._optimizers():
            if isinstance(optimizer, DistributedOptimizer):
                main = [[p.detach().clone() for p in group] for group in optimizer.shard_fp32_from_float16_groups]
                states.append({"inner": optimizer.optimizer.state_dict(), "main": main})
            else:
                states.append({"state": optimizer.state_dict()})
        return states

    def _load_optimizer_state(self, states: list[dict[str, Any]]) -> None:
        optimizers = self._optimizers()
        if len(states) != len(optimizers):
            raise ValueError(f"the checkpoint holds {len(states)} optimizer states, this engine has {len(optimizers)}")
        for optimizer, state in zip(optimizers, states, strict=True):
            if "inner" in state:
                optimizer.optimizer.load_state_dict(state["inner"])
                with torch.no_grad():
                    for group, saved in zip(optimizer.shard_fp32_from_float16_groups, state["main"], strict=True):
                        for param, value in zip(group, saved, strict=True):
                            param.copy_(value)
            else:
                optimizer.load_state_dict(state["state"])

    def _shard_file(self, path: str) -> str:
        return os.path.join(path, f"mp_rank_{self.tp_rank:02d}_{self.pp_rank:03d}_{self.dp_rank:03d}.pt")

    def load_checkpoint(self, path: str) -> None:
        """Load what :meth:`save_checkpoint` wrote with the same tp × pp × dp layout (bit-exact resume)."""
        from megatron.core import tensor_parallel

        check_same_model(os.path.join(path, HF_FOLDER), self.model_config)
        shard = self._shard_file(path)
        if not os.path.exists(shard):
            raise FileNotFoundError(
                f"megatron checkpoint {path} has no {os.path.basename(shard)}: it was saved with another "
                f"tensor/pipeline/data layout than tp={self.tp_size}, pp={self.pp_size}, dp={self.dp_size}"
            )
        state = torch.load(shard, map_location="cpu", weights_only=False)
        self._unwrapped.load_state_dict(state["model"], strict=False)
        if self.optimizer is not None:
            if state["optimizer"] is None:
                raise ValueError(f"megatron checkpoint {path} has no optimizer state (saved by a forward-only engine)")
            self._load_optimizer_state(state["optimizer"])
            self._lr_step = int(state["lr_step"])
            self._set_lr(self.optimizer, self._lr_lambda(self._lr_step))
        torch.set_rng_state(state["rng"]["torch"])
        tensor_parallel.get_cuda_rng_tracker().set_states(state["rng"]["tracker"])
