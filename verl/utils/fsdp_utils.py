"""veRL's ``verl.utils.fsdp_utils`` helpers, which research recipes call on the modules and optimizers they hold.

Our workers shard with FSDP2 through ``verl.workers.engine.FSDPEngine``; a module or optimizer that one of its
engines built carries a reference to that engine (:func:`attach_engine`, done by the legacy worker API in
``verl.workers.fsdp_legacy``). The offload helpers then go through the engine, so that the engine's own
``on_device`` bookkeeping (what our worker methods use around every pass) agrees with what a recipe did by hand. A
module or optimizer built elsewhere is moved directly (``verl.workers.engine.offload``).

On a CPU device there is nothing to move: the engine's calls log once and do nothing, and a direct move to the CPU
leaves tensors where they are.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from verl.utils.device import get_device_name, get_torch_device
from verl.workers.engine import offload
from verl.workers.engine.lora import normalize_peft_param_name

__all__ = [
    "normalize_peft_param_name",
    "attach_engine",
    "engine_of",
    "fsdp_version",
    "get_fsdp_wrap_policy",
    "get_init_weight_context_manager",
    "init_fn",
    "load_fsdp_model_to_gpu",
    "load_fsdp_optimizer",
    "offload_fsdp_model_to_cpu",
    "offload_fsdp_optimizer",
]

logger = logging.getLogger(__name__)

_ENGINE_ATTR = "_verl_engine"


def attach_engine(obj: Any, engine: Any) -> None:
    """Record on ``obj`` (a module or optimizer) the engine that owns it. ``object.__setattr__`` keeps an
    ``nn.Module`` from registering the engine's module as a submodule (it is usually ``obj`` itself)."""
    object.__setattr__(obj, _ENGINE_ATTR, engine)


def engine_of(obj: Any) -> Any:
    """The engine recorded on ``obj`` by :func:`attach_engine`, or None."""
    return getattr(obj, _ENGINE_ATTR, None) if obj is not None else None


def fsdp_version(model: torch.nn.Module) -> int:
    """1 for an FSDP1 ``FullyShardedDataParallel`` module, 2 for an FSDP2 (``fully_shard``) module, 0 otherwise.

    Our one-rank engine keeps a plain module (FSDP2 over one rank would only copy), so its version is 0."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        return 1
    if isinstance(model, FSDPModule):
        return 2
    return 0


def get_fsdp_wrap_policy(module: torch.nn.Module, config: Any = None, is_lora: bool = False) -> Callable | None:
    """An FSDP1 ``auto_wrap_policy`` wrapping each decoder layer (the classes of ``decoder_layer_classes``, or
    ``config.transformer_layer_cls_to_wrap``), as our FSDP2 engine shards one unit per layer.

    ``config`` is veRL's ``fsdp_config.wrap_policy`` mapping; ``config.disable=True`` returns None (no wrapping).
    ``min_num_params`` (size-based wrapping) and ``is_lora`` (wrapping LoRA leaves apart) are not implemented and
    raise NotImplementedError naming them.
    """
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    from verl.workers.engine.hf_model import decoder_layer_classes

    config = dict(config or {})
    if config.get("disable", False):
        return None
    if config.get("min_num_params", 0):
        raise NotImplementedError("wrap_policy.min_num_params (size-based FSDP wrapping) is not implemented")
    if is_lora:
        raise NotImplementedError("get_fsdp_wrap_policy(is_lora=True) is not implemented (LoRA leaves in own units)")
    names = set(decoder_layer_classes(module, config))
    classes = {type(m) for m in module.modules() if type(m).__name__ in names}
    if not classes:
        raise ValueError(
            f"Could not find any of the transformer layer classes {sorted(names)} in {type(module).__name__}: no "
            "decoder layer to wrap (set fsdp_config.wrap_policy.transformer_layer_cls_to_wrap)"
        )
    missing = sorted(names - {cls.__name__ for cls in classes})
    if missing:
        logger.warning(
            "FSDP wrap policy: layer classes %s are not in %s and are skipped; wrapping %s",
            missing,
            type(module).__name__,
            sorted(cls.__name__ for cls in classes),
        )
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes)


def get_init_weight_context_manager(use_meta_tensor: bool = True, mesh: Any = None) -> Callable[[], Any]:
    """A factory of the context in which to build a model before sharding: on the rank that loads the weights
    (global rank 0, or the mesh coordinate 0 of ``mesh``'s last dimension) the CPU; on the others, with
    ``use_meta_tensor``, the meta device (no memory; ``sync_module_states`` or :func:`init_fn` fills them)."""
    loads = True
    if use_meta_tensor:
        loads = (dist.get_rank() if mesh is None else mesh.get_coordinate()[-1]) == 0
    if loads:
        return lambda: torch.device("cpu")
    return lambda: torch.device("meta")


def init_fn(module: torch.nn.Module) -> torch.nn.Module:
    """FSDP1's ``param_init_fn``: on ranks other than 0, allocate ``module``'s own (meta) parameters on the device,
    uninitialised (``sync_module_states`` broadcasts rank 0's values into them)."""
    if dist.get_rank() != 0:
        module = module.to_empty(device=_device(), recurse=False)
    return module


def _device() -> torch.device:
    name = get_device_name()
    return torch.device("cpu") if name == "cpu" else torch.device(name, get_torch_device().current_device())


@torch.no_grad()
def offload_fsdp_model_to_cpu(model: torch.nn.Module, empty_cache: bool = True) -> None:
    """Move ``model``'s parameters (shards), gradients and buffers to host memory (its engine's ``offload_params``
    for an engine-built module)."""
    engine = engine_of(model)
    if engine is not None:
        engine.offload_params()
        return
    offload.move_module(model, "cpu")
    if empty_cache and get_device_name() != "cpu":
        get_torch_device().empty_cache()


@torch.no_grad()
def load_fsdp_model_to_gpu(model: torch.nn.Module) -> None:
    """Bring ``model``'s parameters back to this rank's device (its engine's ``load_params``)."""
    engine = engine_of(model)
    if engine is not None:
        engine.load_params()
        return
    offload.move_module(model, _device())


def _state_tensors(optimizer: torch.optim.Optimizer) -> Iterable[tuple[dict[str, Any], str, torch.Tensor]]:
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                yield state, key, value


@torch.no_grad()
def offload_fsdp_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Move the optimizer state to host memory (its engine's ``offload_optimizer`` for an engine-built one)."""
    engine = engine_of(optimizer)
    if engine is not None:
        engine.offload_optimizer()
        return
    offload.offload_optimizer_state(optimizer)


@torch.no_grad()
def load_fsdp_optimizer(optimizer: torch.optim.Optimizer, device_id: Any = None) -> None:
    """Bring the optimizer state to ``device_id`` (default: this rank's device); Adam's ``step`` counters stay on
    the host, where torch keeps them."""
    engine = engine_of(optimizer)
    if engine is not None:
        engine.load_optimizer()
        return
    device = _device() if device_id is None or get_device_name() == "cpu" else device_id
    for state, key, value in list(_state_tensors(optimizer)):
        if key != "step":
            state[key] = value.to(device, non_blocking=True)
