"""What the Megatron engine checks and prepares before it builds a model: the keys it refuses, the model-parallel
groups, the ranks' layout, and a lazy reader of a Hugging Face folder's tensors. Nothing here imports megatron-core at
module level (workers lay out their dispatch meshes with :func:`megatron_rank_layout` before any engine exists)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from verl.workers.config.engine import McoreEngineConfig

__all__ = [
    "UNREAD_OPTIM_KEYS",
    "init_model_parallel",
    "megatron_rank_layout",
    "refuse_unbuilt",
    "refuse_unread_optim",
    "safetensors_getter",
]

logger = logging.getLogger(__name__)

# megatron-core warns on import that Transformer Engine / Apex are missing, and about a CUDA-graph default: this
# engine builds Megatron's local layer spec, which uses neither, and captures no CUDA graphs
for _message in (r".*(Transformer Engine|Apex).* not installed.*", r"full scope is deprecated.*"):
    warnings.filterwarnings("ignore", message=_message, category=UserWarning)


def refuse_unbuilt(cfg: McoreEngineConfig) -> None:
    """Keys this engine does not implement are refused by name (nothing accepted is ignored)."""
    problems = []
    if (cfg.virtual_pipeline_model_parallel_size or 1) > 1:
        problems.append("virtual_pipeline_model_parallel_size > 1 (the interleaved schedule is not built)")
    if cfg.context_parallel_size > 1:
        problems.append("context_parallel_size > 1 (context parallelism needs packed sequences: GPU only)")
    if cfg.expert_model_parallel_size > 1 or (cfg.expert_tensor_parallel_size or 1) > 1:
        problems.append("expert parallelism (no MoE family is converted here)")
    if cfg.use_dist_checkpointing:
        problems.append("use_dist_checkpointing (models load from their Hugging Face folder)")
    if cfg.override_mcore_model_config:
        problems.append(f"override_mcore_model_config={cfg.override_mcore_model_config}")
    offload = [k for k in ("param_offload", "grad_offload", "optimizer_offload") if getattr(cfg, k)]
    if offload and torch.cuda.is_available():
        problems.append(f"{offload} (offloading the Megatron engine's state is not built)")
    if problems:
        raise ValueError("megatron engine: not supported here: " + "; ".join(problems))
    if offload:
        logger.info("megatron engine: %s do nothing on a CPU device (the state already lives in host memory)", offload)


def megatron_rank_layout(rank: int, world_size: int, tp: int, pp: int) -> tuple[int, int, int, int]:
    """``(tp_rank, dp_rank, pp_rank, dp_size)`` of global ``rank`` in Megatron's default order (tensor-parallel
    ranks adjacent, then data, then pipeline), without megatron-core: workers register their dispatch meshes with it
    before the engine exists, and the engine checks it against Megatron's own."""
    if tp < 1 or pp < 1 or world_size % (tp * pp):
        raise ValueError(
            f"megatron engine: {world_size} ranks do not split into tensor_model_parallel_size={tp} × "
            f"pipeline_model_parallel_size={pp}"
        )
    dp = world_size // (tp * pp)
    return rank % tp, (rank // tp) % dp, rank // (tp * dp), dp


# optim keys of Megatron's block (McoreOptimizerConfig) this engine does not read: refused when set
UNREAD_OPTIM_KEYS = (
    "lr_warmup_init",
    "lr_decay_steps",
    "min_lr",
    "weight_decay_incr_style",
    "lr_wsd_decay_style",
    "lr_wsd_decay_steps",
    "use_checkpoint_opt_param_scheduler",
    "use_layer_wise_distributed_optimizer",
    "override_optimizer_config",
)


def refuse_unread_optim(optim: Any) -> None:
    """Refuse, by name, Megatron optim keys set away from their defaults that the engine does not implement."""
    from verl.workers.config.megatron import McoreOptimizerConfig

    if not isinstance(optim, McoreOptimizerConfig):
        return
    default = McoreOptimizerConfig()
    changed = [k for k in UNREAD_OPTIM_KEYS if getattr(optim, k) != getattr(default, k)]
    if optim.use_layer_wise_distributed_optimizer or optim.optimizer.lower() not in ("adam", "adamw", "sgd"):
        changed.append(f"optimizer={optim.optimizer!r}")
    if changed:
        raise ValueError(f"megatron engine: optim keys set that it does not implement: {changed}")


def init_model_parallel(cfg: McoreEngineConfig) -> None:
    """Megatron's model-parallel groups for ``cfg``'s sizes, made once per process; a second engine asking for another
    layout is refused."""
    from megatron.core import parallel_state as mpu

    tp, pp = cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size
    if mpu.model_parallel_is_initialized():
        have = (mpu.get_tensor_model_parallel_world_size(), mpu.get_pipeline_model_parallel_world_size())
        if have != (tp, pp):
            raise ValueError(
                f"megatron engine: this process already runs tp={have[0]}, pp={have[1]}; a second engine asks for "
                f"tp={tp}, pp={pp} (every role of a worker group shares one layout)"
            )
        return
    megatron_rank_layout(dist.get_rank(), dist.get_world_size(), tp, pp)  # the ranks split into tp × pp
    mpu.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)


def safetensors_getter(model_path: str) -> tuple[Callable[[str], torch.Tensor], contextlib.ExitStack]:
    """A reader of the HF folder's tensors by name (lazily, file by file)."""
    from safetensors import safe_open

    index_file = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.exists(index_file):
        with open(index_file) as f:
            where = json.load(f)["weight_map"]
    else:
        single = os.path.join(model_path, "model.safetensors")
        if not os.path.exists(single):
            raise FileNotFoundError(f"megatron engine: {model_path} has no model.safetensors(.index.json)")
        with safe_open(single, "pt") as handle:
            where = {name: "model.safetensors" for name in handle.keys()}
    stack = contextlib.ExitStack()
    handles: dict[str, Any] = {}

    def get(name: str) -> torch.Tensor:
        if name not in where:
            raise KeyError(f"{name} is not in the weights of {model_path}")
        file = where[name]
        if file not in handles:
            handles[file] = stack.enter_context(safe_open(os.path.join(model_path, file), "pt"))
        return handles[file].get_tensor(name)

    return get, stack
