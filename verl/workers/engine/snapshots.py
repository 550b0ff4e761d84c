"""Numbered copies of a model's parameters in host memory: veRL 0.10's ``save_model_to_cpu(n)`` /
``restore_model_from_cpu(n)`` / ``clear_cpu_model(n)``.

``separate_async`` trains a step one PPO mini-batch at a time as the groups arrive, and every mini-batch's
old-log-prob pass must run the weights the step started from (π_old), which the earlier mini-batches' updates have
changed. The trainer keeps them as copy 0 before the first update, and around each later pass saves the current
weights as copy n, restores copy 0, and restores copy n after (:class:`verl.trainer.ppo.step_policy.StepPolicy`).

Each rank copies its own shards (an FSDP2 parameter's local tensor) of the trainable parameters, so a copy costs one
shard of those in host memory (with LoRA: the adapters alone) and no communication; frozen parameters and buffers
(rotary tables, norms' running stats) are not copied — training does not change them. Restoring writes into the
parameters in place: the optimizer state and any parameter reference stay valid.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["ParameterSnapshots"]


def _local(parameter: torch.Tensor) -> torch.Tensor:
    """The rank's own part of a parameter (a DTensor's local shard; the tensor itself otherwise)."""
    to_local = getattr(parameter, "to_local", None)
    return to_local() if callable(to_local) else parameter


class ParameterSnapshots:
    """Host copies of ``module``'s parameters by number (see the module docstring)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self._copies: dict[int, list[torch.Tensor]] = {}

    def _parameters(self) -> Iterator[torch.Tensor]:
        for parameter in self.module.parameters():
            if parameter.requires_grad:
                yield _local(parameter.data)

    def save(self, n: int) -> None:
        """Copy the current parameters as copy ``n`` (replacing an older copy ``n``)."""
        self._copies[n] = [p.detach().to("cpu", copy=True) for p in self._parameters()]

    @torch.no_grad()
    def restore(self, n: int) -> None:
        """Write copy ``n`` back into the parameters; the copy stays until :meth:`clear`."""
        if n not in self._copies:
            raise KeyError(f"no parameter copy {n} was saved (saved: {sorted(self._copies)})")
        parameters = list(self._parameters())
        copies = self._copies[n]
        if len(parameters) != len(copies):
            raise RuntimeError(f"parameter copy {n} holds {len(copies)} tensors; the model has {len(parameters)}")
        for parameter, saved in zip(parameters, copies, strict=True):
            parameter.copy_(saved)

    def clear(self, n: int) -> None:
        """Drop copy ``n`` (nothing when there is none)."""
        self._copies.pop(n, None)

    def __contains__(self, n: int) -> bool:
        return n in self._copies
