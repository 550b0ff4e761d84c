"""Device mesh and FSDP2 (``fully_shard``) application: one FSDP unit per decoder layer, then the root."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from verl.utils.torch_dtypes import to_torch_dtype
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.engine.hf_model import decoder_layer_classes

if TYPE_CHECKING:  # FSDP2 and DTensor are imported when a model is sharded (~0.45 s of a worker's start-up)
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
    from torch.distributed.tensor import DTensor

__all__ = [
    "apply_fsdp2",
    "build_device_mesh",
    "create_device_mesh",
    "get_sharding_strategy",
    "mixed_precision_policy",
    "plain_module",
    "reshard_all",
    "to_mesh_device",
]

logger = logging.getLogger(__name__)


def build_device_mesh(device_type: str, fsdp_size: int) -> DeviceMesh:
    """A 1-D mesh ``("fsdp",)`` over all ranks, or, when ``fsdp_size`` is a proper divisor of the world size, a
    2-D mesh ``("ddp", "fsdp")`` of shape (world / fsdp_size, fsdp_size) for hybrid sharding."""
    world = dist.get_world_size()
    if fsdp_size in (-1, world):
        return init_device_mesh(device_type, (world,), mesh_dim_names=("fsdp",))
    if fsdp_size > world or world % fsdp_size != 0:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} must be -1 or divide the world size {world}")
    return init_device_mesh(device_type, (world // fsdp_size, fsdp_size), mesh_dim_names=("ddp", "fsdp"))


def create_device_mesh(world_size: int, fsdp_size: int) -> DeviceMesh:
    """veRL's ``fsdp_workers.create_device_mesh``: the mesh of `build_device_mesh` on this device type, where an
    ``fsdp_size`` below 0 or at least ``world_size`` shards over every rank. ``world_size`` must be the process
    group's."""
    from verl.utils.device import get_device_name

    if world_size != dist.get_world_size():
        raise ValueError(f"create_device_mesh(world_size={world_size}): the process group has {dist.get_world_size()}")
    return build_device_mesh(get_device_name(), -1 if fsdp_size < 0 or fsdp_size >= world_size else fsdp_size)


def get_sharding_strategy(device_mesh: DeviceMesh, zero3_enable: bool = True) -> Any:
    """veRL's FSDP1 ``ShardingStrategy`` for a mesh (full or hybrid sharding, ZeRO-3 or ZeRO-2), for forks that read
    it; the engine itself shards with FSDP2, whose equivalent is the mesh's shape and ``reshard_after_forward``."""
    from torch.distributed.fsdp import ShardingStrategy

    if device_mesh.ndim not in (1, 2):
        raise NotImplementedError(f"a device mesh of {device_mesh.ndim} dimensions: only 1 (fsdp) or 2 (ddp, fsdp)")
    if device_mesh.ndim == 1:
        return ShardingStrategy.FULL_SHARD if zero3_enable else ShardingStrategy.SHARD_GRAD_OP
    return ShardingStrategy.HYBRID_SHARD if zero3_enable else ShardingStrategy._HYBRID_SHARD_ZERO2


def mixed_precision_policy(config: FSDPEngineConfig) -> MixedPrecisionPolicy | None:
    """``MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=float32)`` when the compute dtype differs from
    ``model_dtype``; ``fsdp_config.mixed_precision`` overrides its fields. None: compute in the model dtype."""
    override = config.mixed_precision or {}
    param_dtype = to_torch_dtype(override.get("param_dtype", config.dtype))
    reduce_dtype = to_torch_dtype(override.get("reduce_dtype", "float32"))
    if param_dtype == to_torch_dtype(config.model_dtype) and "reduce_dtype" not in override:
        return None
    if "buffer_dtype" in override:
        logger.info("fsdp_config.mixed_precision.buffer_dtype is ignored: FSDP2 keeps buffers in the model dtype")
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype,
        cast_forward_inputs=override.get("cast_forward_inputs", True),
    )


def apply_fsdp2(module: torch.nn.Module, mesh: DeviceMesh, config: FSDPEngineConfig) -> FSDPModule:
    """Shard ``module`` in place: ``fully_shard`` each decoder layer (see ``decoder_layer_classes``), then the root.

    The parameters become DTensors sharded on dim 0 over the mesh's "fsdp" dimension and move to the mesh's device.
    ``offload_policy`` keeps the shards in pinned host memory (FSDP2's ``CPUOffloadPolicy``; accelerators only).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    kwargs = {
        "mesh": mesh,
        "reshard_after_forward": config.reshard_after_forward,
        "offload_policy": CPUOffloadPolicy(pin_memory=True) if config.offload_policy else OffloadPolicy(),
    }
    policy = mixed_precision_policy(config)
    if policy is not None:
        kwargs["mp_policy"] = policy
    classes = decoder_layer_classes(module, config.wrap_policy)
    layers = [m for m in module.modules() if type(m).__name__ in classes]
    if classes and not layers:
        logger.warning("no submodule of %s is one of %s: sharding the root only", type(module).__name__, classes)
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(module, **kwargs)
    if config.forward_prefetch:
        # In forward, each layer starts the all-gather of the next one (FSDP2 prefetches one layer by default only in
        # backward).
        for layer, following in zip(layers, layers[1:], strict=False):
            layer.set_modules_to_forward_prefetch([following])
    logger.info("FSDP2: %d layer units + root over mesh %s; mixed precision %s", len(layers), tuple(mesh.shape), policy)
    return module


def plain_module(module: torch.nn.Module, device: torch.device, config: FSDPEngineConfig) -> torch.nn.Module:
    """The one-rank engine's model: ``module`` moved to ``device``, unwrapped. With mixed precision its forward
    (and so its backward) runs under ``torch.autocast(dtype=param_dtype)``: matmuls in the compute dtype, the
    weights, gradients and optimizer in the model dtype, as FSDP2's policy keeps them."""
    module.to(device)
    policy = mixed_precision_policy(config)
    compute = None if policy is None or policy.param_dtype == to_torch_dtype(config.model_dtype) else policy.param_dtype
    if compute is not None:
        module.forward = torch.autocast(device.type, dtype=compute)(module.forward)
    logger.info("one rank: a plain module (no FSDP2); autocast to %s", compute)
    return module


def reshard_all(module: torch.nn.Module) -> None:
    """Free gathered parameters of every FSDP unit in ``module``.

    After a forward under ``torch.no_grad`` the root unit (and every unit when ``reshard_after_forward`` is false)
    keeps its unsharded parameters, since no backward will free them; DCP's optimizer state dict then fails with
    ``KeyError: 0``. Call this after no-grad forwards.
    """
    fsdp = sys.modules.get("torch.distributed.fsdp")  # not imported: nothing was sharded
    for sub in module.modules() if fsdp is not None else ():
        if isinstance(sub, fsdp.FSDPModule):
            sub.reshard()


def to_mesh_device(tensor: DTensor) -> DTensor:
    """The DTensor with its local part on its mesh's device type (CPU-offloaded shards live on the host, but their
    collectives run on the mesh's device, e.g. nccl needs CUDA tensors)."""
    if tensor.to_local().device.type != tensor.device_mesh.device_type:
        return tensor.to(tensor.device_mesh.device_type)
    return tensor
