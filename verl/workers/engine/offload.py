"""Moving FSDP2 parameter shards and optimizer state between an accelerator and host memory, by hand.

FSDP2's own ``CPUOffloadPolicy`` needs an accelerator; these helpers are what ``fsdp_config.param_offload`` and
``optimizer_offload`` use between the phases of an RL step (e.g. free the actor's memory while the rollout engine
generates). They are only called on accelerator devices: on a CPU device everything is in host memory already.
"""

from __future__ import annotations

import torch

__all__ = ["load_optimizer_state", "move_module", "offload_optimizer_state"]


def move_module(module: torch.nn.Module, device: torch.device | str) -> None:
    """Move the module's (sharded) parameters, gradients and buffers to ``device``.

    ``FSDPModule._apply`` reshards first and re-registers the sharded parameters afterwards, so ``.to`` is safe on an
    FSDP2 module; parameter objects keep their identity, so the optimizer still refers to them.
    """
    module.to(device)


def offload_optimizer_state(optimizer: torch.optim.Optimizer) -> list[tuple[torch.nn.Parameter, str, torch.device]]:
    """Move every optimizer-state tensor that is not on the host to the host.

    Returns what was moved, as (parameter, state key, original device), for ``load_optimizer_state``. Tensors that
    already live on the host (e.g. Adam's ``step`` counters) stay where they are.
    """
    moved = []
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.device.type != "cpu":
                moved.append((param, key, value.device))
                state[key] = value.to("cpu")
    return moved


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, moved: list[tuple[torch.nn.Parameter, str, torch.device]]
) -> None:
    """Undo ``offload_optimizer_state``: move each recorded tensor back to its original device."""
    for param, key, device in moved:
        state = optimizer.state[param]
        state[key] = state[key].to(device, non_blocking=True)
