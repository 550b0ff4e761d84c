"""Optimizer construction from ``optim.*`` and gradient clipping that works on FSDP2 (DTensor) gradients."""

from __future__ import annotations

import importlib
import logging
import math
from collections.abc import Iterable

import torch

from verl.utils.dtensor import is_dtensor
from verl.workers.config.optimizer import FSDPOptimizerConfig
from verl.workers.engine.sharding import to_mesh_device

__all__ = ["build_optimizer", "clip_grad_norm", "clip_grad_norm_and_step"]

logger = logging.getLogger(__name__)


def build_optimizer(params: Iterable[torch.nn.Parameter], optim: FSDPOptimizerConfig) -> torch.optim.Optimizer:
    """``optim.optimizer_impl.<optim.optimizer>(params, lr, weight_decay, betas, **override_optimizer_config)``.

    ``betas`` is passed only to Adam-family optimizers (a name containing "adam"). Raises ValueError naming the
    module or class that cannot be found.
    """
    try:
        module = importlib.import_module(optim.optimizer_impl)
    except ImportError as e:
        raise ValueError(f"optim.optimizer_impl={optim.optimizer_impl!r} cannot be imported: {e}") from e
    optimizer_cls = getattr(module, optim.optimizer, None)
    if not (isinstance(optimizer_cls, type) and issubclass(optimizer_cls, torch.optim.Optimizer)):
        raise ValueError(
            f"optim.optimizer={optim.optimizer!r} is not an optimizer class in {optim.optimizer_impl!r} "
            f"(e.g. 'AdamW' in 'torch.optim')"
        )
    kwargs = {"lr": optim.lr, "weight_decay": optim.weight_decay}
    if "adam" in optim.optimizer.lower():
        kwargs["betas"] = tuple(optim.betas)
    kwargs.update(optim.override_optimizer_config or {})
    return optimizer_cls(params, **kwargs)


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale the gradients of ``params`` in place so that their total 2-norm is at most ``max_norm``.

    Returns the total norm before clipping as a plain scalar tensor, identical on every rank. Over sharded DTensor
    gradients each rank first holds a partial norm; it is reduced over the mesh (on the mesh's device, also when
    FSDP2's CPUOffloadPolicy keeps the shards on the host).
    """
    with_grads = [p for p in params if p.grad is not None]
    total = torch.nn.utils.get_total_norm([p.grad for p in with_grads], norm_type=2.0)
    if is_dtensor(total):
        total = to_mesh_device(total)
    torch.nn.utils.clip_grads_with_norm_(with_grads, max_norm, total)
    return total.full_tensor() if is_dtensor(total) else total


def clip_grad_norm_and_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float) -> float:
    """Clip ``module``'s gradients to ``max_norm``, step ``optimizer`` and clear the gradients.

    Returns the total gradient norm before clipping (the same on every rank). When it is NaN or infinite the step
    is skipped (a warning is logged) and the gradients are cleared all the same; the norm is still returned so
    callers can count such steps.
    """
    grad_norm = float(clip_grad_norm(module.parameters(), max_norm))
    if math.isfinite(grad_norm):
        optimizer.step()
    else:
        logger.warning("grad norm is %s: skipping this optimizer step (gradients dropped)", grad_norm)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm
